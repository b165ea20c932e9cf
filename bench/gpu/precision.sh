#!/usr/bin/env bash
# Issue 15 on the GPU machine: the 8-bit KV cache (docs/precision.md), from the repo root with the bundle
# (scripts/bundle.sh) carried along.
#   1. tests    the 8-bit KV gpu tests: stoke_kernels_cuda_test '*CudaQuant*' (quantising write, decode and
#               prefill attention against the CPU reference) and stoke_engine_cuda_test '*QuantizedKv*'
#   2. synth    a Llama-3.1-8B-shaped model with random bf16 weights (stoke model synth; no download)
#   3. step     stoke bench step --device cuda: decode steps at batch 64 and 256, context 1000, for
#               --kv-cache-dtype bf16, int8 and fp8; each JSON also carries the KV capacity the device
#               leaves at that dtype (kv_cache.capacity_blocks, --gpu-memory-fraction 0.9, blocks of 16)
#   4. check    stoke model check --device cuda --kv-cache-dtype int8 and fp8 on that model (the gate: the
#               8-bit cache against bf16; random weights, so the verdict says more about the metrics than
#               about a real model's quality)
#   5. $OUT/precision_summary.json: per dtype, KV bytes/token and blocks, decode ms and tok/s at each batch
#               (and the ratio to bf16), and the gate's metrics
# Usage: bench/gpu/precision.sh [BIN_DIR]   (BIN_DIR: the bundle's bin/, default .bundle/bin)
# Everything lands in $OUT (default /tmp/stoke_gpu_out): precision_*.log, step_kv_<dtype>_b<batch>.json,
# check_<dtype>.json, precision_summary.json. Budget: about 4-5 minutes on an H200. Knobs (env):
# PREC_PARTS ("tests step check"), PREC_BATCHES ("64 256"), PREC_CONTEXT (1000), PREC_ITERS (20),
# PREC_CHECK_TOKENS (1024), LLM_SHAPE (llama-3.1-8b), LLM_LAYERS (fewer layers); a CPU dry run of the script:
#   PREC_DEVICE=cpu PREC_PARTS="step check" LLM_SHAPE=smollm2-135m LLM_LAYERS=2 PREC_BATCHES="2 4" \
#   PREC_CONTEXT=32 PREC_ITERS=2 PREC_CHECK_TOKENS=64 bench/gpu/precision.sh build/release/apps/stoke
set -uo pipefail
BIN_ARG=${1:+$(realpath "$1")}  # before the cd: a relative BIN_DIR is the caller's
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=bench/gpu/common.sh
source bench/gpu/common.sh
bench_setup "$BIN_ARG"
BATCHES=${PREC_BATCHES:-"64 256"}
CONTEXT=${PREC_CONTEXT:-1000}
ITERS=${PREC_ITERS:-20}
CHECK_TOKENS=${PREC_CHECK_TOKENS:-1024}
DTYPES="bf16 int8 fp8"
DEVICE=${PREC_DEVICE:-cuda}
GEMM_CACHE=${GEMM_CACHE:-$OUT/gemm_cache.json}
PARTS=" ${PREC_PARTS:-tests step check} "
want() { [[ $PARTS == *" $1 "* ]]; }

if want tests; then
  stamp "gpu tests: 8-bit KV kernels and decoder"
  timeout 120 "$BIN/stoke_kernels_cuda_test" --gtest_filter='*CudaQuant*' > "$OUT/precision_kernels_test.log" 2>&1
  echo "stoke_kernels_cuda_test *CudaQuant*: exit $?"; tail -3 "$OUT/precision_kernels_test.log"
  timeout 120 "$BIN/stoke_engine_cuda_test" --gtest_filter='*QuantizedKv*' > "$OUT/precision_engine_test.log" 2>&1
  echo "stoke_engine_cuda_test *QuantizedKv*: exit $?"; tail -3 "$OUT/precision_engine_test.log"
fi

if want step || want check; then
  synth_model "$OUT/precision_synth.log" || exit 1
fi

if want step; then
  # Batch 256 first (the most KV), bf16 first at each batch: the ratios compare runs minutes apart at most.
  for b in $(echo "$BATCHES" | tr ' ' '\n' | sort -rn); do
    for kv in $DTYPES; do
      stamp "bench step: decode batch $b, context $CONTEXT, kv $kv"
      timeout 150 "$STOKE" bench step --model "$MODEL" --device "$DEVICE" --gemm-cache "$GEMM_CACHE" \
        --kv-cache-dtype "$kv" --decode-batch "$b" --context "$CONTEXT" --prefill 0 --iters "$ITERS" \
        --json "$OUT/step_kv_${kv}_b$b.json" > "$OUT/precision_step_${kv}_b$b.log" 2>&1 ||
        echo "bench step (kv $kv, batch $b) failed: exit $?"
      grep -E 'KV |decode median' "$OUT/precision_step_${kv}_b$b.log" | sed 's/^/  /'
    done
  done
fi

if want check; then
  # The gate reads /usr/share/common-licenses/GPL-3 by default; a host without it gets the repo's docs.
  DATA_ARG=()
  if [[ ! -f /usr/share/common-licenses/GPL-3 ]]; then
    cat docs/*.md > "$OUT/gate_text.txt"
    DATA_ARG=(--data "$OUT/gate_text.txt")
  fi
  for kv in int8 fp8; do
    stamp "model check --device cuda --kv-cache-dtype $kv ($CHECK_TOKENS tokens)"
    timeout 240 "$STOKE" model check --model "$MODEL" --device "$DEVICE" --gemm-cache "$GEMM_CACHE" \
      --kv-cache-dtype "$kv" --tokens "$CHECK_TOKENS" "${DATA_ARG[@]}" --json "$OUT/check_$kv.json" \
      > "$OUT/precision_check_$kv.log" 2>&1
    echo "model check kv $kv: exit $? (0 pass, 1 fail, 2 usage)"
    grep -E 'PASS|FAIL' "$OUT/precision_check_$kv.log" | sed 's/^/  /'
  done
fi

stamp "summary"
python3 - "$OUT" "$BATCHES" <<'PY'
import json, pathlib, sys
out, batches = pathlib.Path(sys.argv[1]), sys.argv[2].split()
def load(name):
    p = out / name
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
summary = {"kv": {}, "check": {}}
for kv in ("bf16", "int8", "fp8"):
    row = {}
    for b in batches:
        j = load(f"step_kv_{kv}_b{b}.json")
        if not j:
            continue
        row.setdefault("kv_cache", j.get("kv_cache"))
        d = j.get("decode", {})
        row[f"b{b}"] = {"step_ms_median": d.get("step_ms", {}).get("median"),
                        "tokens_per_s": d.get("tokens_per_s"), "achieved_gbps": d.get("achieved_gbps"),
                        "hbm_roofline_fraction": d.get("hbm_roofline_fraction")}
    summary["kv"][kv] = row
for kv in ("int8", "fp8"):
    for b in batches:
        base, cur = summary["kv"].get("bf16", {}).get(f"b{b}"), summary["kv"].get(kv, {}).get(f"b{b}")
        if base and cur and base.get("tokens_per_s") and cur.get("tokens_per_s"):
            cur["tokens_per_s_vs_bf16"] = cur["tokens_per_s"] / base["tokens_per_s"]
    cap = summary["kv"].get(kv, {}).get("kv_cache") or {}
    base_cap = summary["kv"].get("bf16", {}).get("kv_cache") or {}
    if cap.get("capacity_blocks") and base_cap.get("capacity_blocks"):
        summary["kv"][kv]["capacity_vs_bf16"] = cap["capacity_blocks"] / base_cap["capacity_blocks"]
    c = load(f"check_{kv}.json")
    if c:
        metrics = {m["name"]: {"value": m["value"], "pass": m["pass"]} for m in c.get("metrics", [])}
        summary["check"][kv] = {"pass": c.get("pass"), "positions": c.get("positions"), "metrics": metrics}
json.dump(summary, open(out / "precision_summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
stamp "done"
