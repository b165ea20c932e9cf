#!/usr/bin/env bash
# A/B of the GGUF K-quant GEMVs between two builds, on the GPU machine: `cuda_bench --only gemvk` from a
# baseline binary and a candidate one, alternated GEMVK_ROUNDS times (drift between processes shows as spread),
# then $OUT/gemvk_ab.json: per (format, shape) each binary's choices (math, rows per warp) as median GB/s, each
# candidate choice's ratio to the same baseline choice, and best candidate / best baseline.
# Usage: GEMVK_BASE=path/to/old/cuda_bench GEMVK_NEW=path/to/new/cuda_bench bench/gpu/gemvk_ab.sh
# Env: OUT [/tmp/stoke_gpu_out], GEMVK_ROUNDS [2].
set -uo pipefail
OUT=${OUT:-/tmp/stoke_gpu_out}
ROUNDS=${GEMVK_ROUNDS:-2}
: "${GEMVK_BASE:?the baseline cuda_bench}" "${GEMVK_NEW:?the candidate cuda_bench}"
mkdir -p "$OUT"
if [[ -d /usr/local/cuda/lib64 ]]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
for ((i = 1; i <= ROUNDS; ++i)); do
  timeout 120 "$GEMVK_BASE" --only gemvk > "$OUT/gemvk_base_$i.jsonl" 2> "$OUT/gemvk_base_$i.log" || echo "baseline round $i: exit $?"
  timeout 120 "$GEMVK_NEW" --only gemvk > "$OUT/gemvk_new_$i.jsonl" 2> "$OUT/gemvk_new_$i.log" || echo "candidate round $i: exit $?"
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(tag):
    rows = {}
    device = None
    for i in range(1, rounds + 1):
        try:
            lines = open(f"{out}/gemvk_{tag}_{i}.jsonl").read().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("bench") == "device":
                device = r.get("name")
            if r.get("bench") != "gemvk":
                continue
            key = (r["format"], r["shape"], r.get("math", "as built"), r.get("rows_per_warp", "as built"))
            rows.setdefault(key, []).append(r["gbps"])
    return rows, device
base, device = load("base")
new, _ = load("new")
# One entry per (format, shape): the baseline's and the candidate's choices side by side, each choice (math, rows
# per warp) matched to the same choice of the other binary where both report it (a baseline built before the
# choices existed reports one "as built" row: every candidate choice is compared with it).
summary = {"device": device, "rounds": rounds, "shapes": []}
for fmt, shape in sorted({(k[0], k[1]) for k in base}):
    bk = {k[2:]: statistics.median(g) for k, g in base.items() if k[:2] == (fmt, shape)}
    entry = {"format": fmt, "shape": shape, "baseline": [], "candidate": []}
    for choice, b in sorted(bk.items(), key=lambda kv: str(kv[0])):
        entry["baseline"].append({"math": choice[0], "rows_per_warp": choice[1], "gbps": round(b, 1)})
    for (f2, s2, math, rows), g in sorted(new.items(), key=lambda kv: str(kv[0])):
        if (f2, s2) != (fmt, shape):
            continue
        m = statistics.median(g)
        b = bk.get((math, rows), bk.get(("as built", "as built")))
        entry["candidate"].append({"math": math, "rows_per_warp": rows, "gbps": round(m, 1), "runs": g,
                                   "vs_baseline_same_choice": round(m / b, 3) if b else None})
    best_b = max(entry["baseline"], key=lambda c: c["gbps"])
    best_n = max(entry["candidate"], key=lambda c: c["gbps"], default=None)
    entry["best_vs_best"] = round(best_n["gbps"] / best_b["gbps"], 3) if best_n else None
    summary["shapes"].append(entry)
json.dump(summary, open(f"{out}/gemvk_ab.json", "w"), indent=1)
for e in summary["shapes"]:
    best_b = max(e["baseline"], key=lambda c: c["gbps"])
    best = max(e["candidate"], key=lambda c: c["gbps"], default=None)
    print(e["format"], e["shape"], "best baseline", (best_b["math"], best_b["rows_per_warp"], best_b["gbps"]),
          "GB/s; best candidate", best and (best["math"], best["rows_per_warp"], best["gbps"]), "ratio",
          e["best_vs_best"])
PY
