#!/usr/bin/env bash
# Serve flags A/B under one load in one call, on the GPU machine from the repo root with .bundle/ carried along:
# bench/gpu/llm_bench.sh's serving part (SKIP_STEP=1 SKIP_HF=1: stoke serve + stoke bench + stoke doctor watching
# the window) once per variant, the variants in turn AB_ROUNDS times, then $OUT/serve_ab.json: per variant and
# round the output tok/s, TTFT and TPOT p50 / p99, the doctor's step split (model / host / output-thread ms per
# step), and each variant's median over the rounds against the first variant's.
#   AB_VARIANTS  "name|flags;name|flags;..."; default: base (the defaults: --async-output auto is on with a
#                GPU, and so is --vector-elementwise), novec (--vector-elementwise off), sync (--async-output off)
#   AB_COMMON    flags every variant gets (default "--quantization fp8 --kv-cache-dtype fp8 --allow-inconsistent":
#                the random weights fail the fp8 load gate, which stops the server)
#   AB_ROUNDS    1 (each variant once; a round of the 3 defaults at c=512 with a 70 s window is ~6 min, so
#                more rounds go in more calls: AB_ROUND_OFFSET=1 names the second call's round 1)
#   LLM_CONCURRENCY (512), LLM_DURATION_S (70: a 1000/1000 request at c=512 takes ~45 s, the window must hold
#   whole requests for valid TTFT / TPOT), LLM_WARMUP_S (15), LLM_INPUT / LLM_OUTPUT (1000), LLM_TRACE_S, as
#   llm_bench.sh.
# Example (the 8B shape synthesised on the GPU machine first, once):
#   AB_VARIANTS="base|;novec|--vector-elementwise off" AB_ROUNDS=2 bash bench/gpu/serve_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
export OUT SKIP_STEP=1 SKIP_HF=1
export LLM_CONCURRENCY=${LLM_CONCURRENCY:-512}
export LLM_DURATION_S=${LLM_DURATION_S:-70}
VARIANTS=${AB_VARIANTS:-"base|;novec|--vector-elementwise off;sync|--async-output off"}
COMMON=${AB_COMMON-"--quantization fp8 --kv-cache-dtype fp8 --allow-inconsistent"}  # set but empty: no common flags
ROUNDS=${AB_ROUNDS:-1}
OFFSET=${AB_ROUND_OFFSET:-0}
IFS=';' read -r -a LIST <<< "$VARIANTS"
for (( r = OFFSET; r < OFFSET + ROUNDS; ++r )); do
  for v in "${LIST[@]}"; do
    name=${v%%|*}
    flags=${v#*|}
    echo "== serve_ab round $r: $name ($COMMON $flags)" >&2
    LLM_TAG="_ab_${name}_r$r" LLM_SERVE_ARGS="$COMMON $flags" bash bench/gpu/llm_bench.sh > /dev/null 2>&1 ||
      echo "serve_ab: $name round $r failed: exit $?" >&2
    grep -h "output tok/s" "$OUT/llm_bench_ab_${name}_r$r.log" >&2 || true
  done
done
python3 - "$OUT" "$VARIANTS" "$COMMON" <<'PY'
import json, pathlib, statistics, sys
out, variants, common = pathlib.Path(sys.argv[1]), sys.argv[2].split(";"), sys.argv[3]
names = [v.split("|", 1)[0] for v in variants]
rows = {n: [] for n in names}
for p in sorted(out.glob("llm_bench_summary_ab_*_r*.json")):
    name, rnd = p.stem[len("llm_bench_summary_ab_"):].rsplit("_r", 1)
    if name not in rows:
        continue
    for s in json.loads(p.read_text()).get("serving", []):
        st = s.get("stoke", {})
        rows[name].append({"round": int(rnd), "concurrency": s.get("concurrency"), **{k: st.get(k) for k in (
            "output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "valid",
            "doctor_verdict", "step_split", "error")}})
def med(name, key):
    v = [r[key] for r in rows[name] if isinstance(r.get(key), (int, float))]
    return statistics.median(v) if v else None
base = names[0]
summary = {"common_flags": common, "variants": {v.split("|", 1)[0]: v.split("|", 1)[1] for v in variants},
           "runs": rows, "medians": {}}
for n in names:
    m = {k: med(n, k) for k in ("output_tokens_per_s", "tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50", "ttft_ms_p99")}
    b = med(base, "output_tokens_per_s")
    if m["output_tokens_per_s"] and b:
        m["output_tokens_per_s_over_" + base] = m["output_tokens_per_s"] / b
    summary["medians"][n] = m
(out / "serve_ab.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary["medians"], indent=2))
PY
