#!/usr/bin/env bash
# Issue 15 on the GPU machine: fp8 E4M3 weights (--quantization fp8, docs/precision.md), from the repo root with
# the bundle (scripts/bundle.sh) carried along.
#   1. tests   stoke_kernels_cuda_test: the fp8 quantiser (bit-exact vs the CPU), the fp8 GEMV and its SwiGLU
#              form, the cuBLASLt FP8 GEMM (per-token x per-channel scales), the bf16 GEMV/GEMM beside them;
#              stoke_engine_cuda_test: CudaLlama with fp8 weights vs bf16 (GEMV and all-GEMM paths), the GEMV
#              and GGUF paths unchanged, and the real SmolLM2 through the gate (fp8 passes, scales x1.5 fail;
#              skips unless the model was carried: scripts/split_for_device.sh)
#   2. synth   the Llama-3.1-8B shape with random bf16 weights (stoke model synth)
#   3. step    stoke bench step: decode batch 1 at context 512 (bf16 weights vs fp8, alternated, FP8_REPS
#              rounds), then batch 64 and 256 at context 1000: bf16 weights + bf16 KV vs fp8 weights + fp8 KV
#   4. check   stoke model check --quantization fp8 (and with --kv-cache-dtype fp8) on the 8B shape
#   5. $OUT/fp8_summary.json: decode tok/s per point and the fp8 / bf16 ratios; the gate's metrics
# Usage: bench/gpu/fp8.sh [BIN_DIR]  (default .bundle/bin). Knobs (env): FP8_PARTS ("tests step check"),
# FP8_REPS (2), FP8_BATCHES ("64 256"), FP8_ITERS (40), FP8_CHECK_TOKENS (1024), FP8_CHECK_KV ("auto fp8"),
# FP8_SPLITS (fp8 GEMV warps per row to try at batch 1, e.g. "1 2 4"), FP8_SERVE_CONC (256),
# FP8_SERVE_WARMUP_S (10), FP8_SERVE_DURATION_S (30); part "serve" (not in the default parts): 1000/1000 served
# with bf16, fp8 weights, and fp8 weights + fp8 KV (bench/gpu/llm_bench.sh); part "check" also gates the real
# SmolLM2 when it is on disk;
# LLM_SHAPE, LLM_LAYERS.
# CPU dry run of the plumbing: FP8_DEVICE=cpu FP8_PARTS="step check" LLM_SHAPE=smollm2-135m LLM_LAYERS=2
#   FP8_BATCHES=2 FP8_ITERS=2 FP8_CHECK_TOKENS=64 bench/gpu/fp8.sh build/release/apps/stoke
set -uo pipefail
BIN_ARG=${1:+$(realpath "$1")}
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=bench/gpu/common.sh
source bench/gpu/common.sh
bench_setup "$BIN_ARG"
REPS=${FP8_REPS:-2}
BATCHES=${FP8_BATCHES:-"64 256"}
ITERS=${FP8_ITERS:-40}
CHECK_TOKENS=${FP8_CHECK_TOKENS:-1024}
DEVICE=${FP8_DEVICE:-cuda}
GEMM_CACHE=${GEMM_CACHE:-$OUT/gemm_cache.json}
PARTS=" ${FP8_PARTS:-tests step check} "
want() { [[ $PARTS == *" $1 "* ]]; }

if want tests; then
  if [[ -f /tmp/stoke_carry/manifest ]]; then
    stamp "joining the carried model parts"
    bash scripts/split_for_device.sh join || echo "join failed: the real-model tests will skip"
  fi
  stamp "gpu tests: fp8 kernels"
  timeout 180 "$BIN/stoke_kernels_cuda_test" --gtest_filter='CudaFp8*:CudaGemv*:CudaGemm*:CudaQuant*' \
    > "$OUT/fp8_kernels_test.log" 2>&1
  echo "stoke_kernels_cuda_test fp8/gemv/gemm: exit $?"; grep -E '^\s+\[|FAILED|PASSED' "$OUT/fp8_kernels_test.log" | tail -40
  stamp "gpu tests: CudaLlama fp8"
  timeout 300 "$BIN/stoke_engine_cuda_test" \
    --gtest_filter='*Fp8*:CudaLlamaTest.SplitRowGemvAndPdlMatchCpu:CudaLlamaTest.GgufQ8_0MatchesCpu:CudaLlamaTest.F32WeightsMatchCpu:CudaLlamaTest.QuantizedKv*:CudaLlamaRealModelTest.SmolLm2MatchesCpu' \
    > "$OUT/fp8_engine_test.log" 2>&1
  echo "stoke_engine_cuda_test fp8: exit $?"; grep -E 'fp8|PASS|FAIL|SKIP|top-1|OK \]' "$OUT/fp8_engine_test.log" | tail -40
fi

if want step || want check; then
  synth_model "$OUT/fp8_synth.log" || exit 1
fi

step() {  # step TAG ARGS...: one bench step run into $OUT/fp8_step_TAG.json
  local tag=$1; shift
  stamp "bench step $tag: $*"
  timeout 200 "$STOKE" bench step --model "$MODEL" --device "$DEVICE" --gemm-cache "$GEMM_CACHE" --prefill 0 \
    --iters "$ITERS" "$@" --json "$OUT/fp8_step_$tag.json" > "$OUT/fp8_step_$tag.log" 2>&1 ||
    { echo "bench step $tag failed: exit $?"; tail -5 "$OUT/fp8_step_$tag.log"; }
  grep -E 'decode median|weights' "$OUT/fp8_step_$tag.log" | head -3 | sed 's/^/  /'
}

if want step; then
  for r in $(seq 1 "$REPS"); do
    step "b1_bf16_r$r" --decode-batch 1 --context 512 --quantization none
    step "b1_fp8_r$r" --decode-batch 1 --context 512 --quantization fp8
  done
  for sp in ${FP8_SPLITS:-}; do  # the fp8 GEMV's warps per row (auto: Fp8GemvSplitFor)
    step "b1_fp8_split$sp" --decode-batch 1 --context 512 --quantization fp8 --gemv-split "$sp"
  done
  for b in $BATCHES; do
    step "b${b}_bf16" --decode-batch "$b" --context 1000 --quantization none --kv-cache-dtype bf16
    step "b${b}_fp8_kvfp8" --decode-batch "$b" --context 1000 --quantization fp8 --kv-cache-dtype fp8
    step "b${b}_fp8" --decode-batch "$b" --context 1000 --quantization fp8 --kv-cache-dtype bf16
  done
fi

if want check; then
  DATA_ARG=()
  if [[ ! -f /usr/share/common-licenses/GPL-3 ]]; then
    cat docs/*.md > "$OUT/gate_text.txt"
    DATA_ARG=(--data "$OUT/gate_text.txt")
  fi
  for kv in ${FP8_CHECK_KV:-auto fp8}; do
    stamp "model check --quantization fp8 --kv-cache-dtype $kv ($CHECK_TOKENS tokens)"
    timeout 240 "$STOKE" model check --model "$MODEL" --device "$DEVICE" --gemm-cache "$GEMM_CACHE" \
      --quantization fp8 --kv-cache-dtype "$kv" --tokens "$CHECK_TOKENS" "${DATA_ARG[@]}" \
      --json "$OUT/fp8_check_kv$kv.json" > "$OUT/fp8_check_kv$kv.log" 2>&1
    echo "model check fp8 weights, kv $kv: exit $? (0 pass, 1 fail, 2 usage)"
    grep -E 'PASS|FAIL|error' "$OUT/fp8_check_kv$kv.log" | sed 's/^/  /'
  done
fi

if want check && [[ -f "${STOKE_MODEL_DIR:-$HOME/.cache/stoke/models}/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" ]]; then
  stamp "model check: the real SmolLM2 (Q4_1 dequantised to bf16 on the GPU, then fp8), --quantization fp8"
  timeout 120 "$STOKE" model check --model smollm2-135m-instruct --device "$DEVICE" --quantization fp8 \
    "${DATA_ARG[@]}" --json "$OUT/fp8_check_smollm2.json" > "$OUT/fp8_check_smollm2.log" 2>&1
  echo "model check smollm2 fp8 weights: exit $?"; grep -E 'PASS|FAIL|error' "$OUT/fp8_check_smollm2.log" | sed 's/^/  /'
fi

if want serve; then
  # 1000 in / 1000 out at FP8_SERVE_CONC (bench/gpu/llm_bench.sh's serving part): bf16, fp8 weights, fp8 weights +
  # fp8 KV, one server after the other on the same synthetic 8B.
  for cfg in "bf16|" "fp8|--quantization fp8" "fp8_kvfp8|--quantization fp8 --kv-cache-dtype fp8"; do
    IFS='|' read -r tag args <<< "$cfg"
    stamp "serving 1000/1000, c=${FP8_SERVE_CONC:-256}: $tag"
    OUT=$OUT STOKE_BIN=$STOKE LLM_MODEL_DIR=$MODEL LLM_SHAPE=$SHAPE SKIP_STEP=1 SKIP_HF=1 \
      LLM_CONCURRENCY=${FP8_SERVE_CONC:-256} LLM_WARMUP_S=${FP8_SERVE_WARMUP_S:-10} \
      LLM_DURATION_S=${FP8_SERVE_DURATION_S:-30} LLM_TAG="_$tag" LLM_SERVE_ARGS="$args" \
      timeout 200 bash bench/gpu/llm_bench.sh > "$OUT/fp8_serve_$tag.log" 2>&1
    grep -E '^c=|did not start|failed' "$OUT/fp8_serve_$tag.log" | sed 's/^/  /'
    cp "$OUT/llm_serve.log" "$OUT/fp8_serve_${tag}_server.log" 2>/dev/null
  done
fi

stamp "summary"
python3 - "$OUT" "$REPS" "$BATCHES" <<'PY'
import json, pathlib, statistics, sys
out, reps, batches = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split()
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
def point(j):
    d = (j or {}).get("decode", {})
    return {"step_ms_median": d.get("step_ms", {}).get("median"), "tokens_per_s": d.get("tokens_per_s"),
            "achieved_gbps": d.get("achieved_gbps"), "hbm_roofline_fraction": d.get("hbm_roofline_fraction"),
            "weight_bytes": (j or {}).get("model", {}).get("weight_bytes"),
            "kv_cache": (j or {}).get("kv_cache")}
s = {"b1": {}, "batched": {}, "check": {}}
for q in ("bf16", "fp8"):
    runs = [point(load(f"fp8_step_b1_{q}_r{r}.json")) for r in range(1, reps + 1)]
    tps = [p["tokens_per_s"] for p in runs if p["tokens_per_s"]]
    s["b1"][q] = {"runs": runs, "tokens_per_s_median": statistics.median(tps) if tps else None}
if s["b1"]["bf16"]["tokens_per_s_median"] and s["b1"]["fp8"]["tokens_per_s_median"]:
    s["b1"]["fp8_vs_bf16"] = s["b1"]["fp8"]["tokens_per_s_median"] / s["b1"]["bf16"]["tokens_per_s_median"]
for b in batches:
    row = {t: point(load(f"fp8_step_b{b}_{t}.json")) for t in ("bf16", "fp8", "fp8_kvfp8")}
    base = row["bf16"]["tokens_per_s"]
    for t in ("fp8", "fp8_kvfp8"):
        if base and row[t]["tokens_per_s"]:
            row[t]["tokens_per_s_vs_bf16"] = row[t]["tokens_per_s"] / base
    s["batched"][f"b{b}"] = row
for sp in ("1", "2", "4"):
    j = load(f"fp8_step_b1_fp8_split{sp}.json")
    if j:
        s["b1"][f"fp8_split{sp}"] = point(j)
s["serving"] = {}
for tag in ("bf16", "fp8", "fp8_kvfp8"):
    for d in sorted(out.glob(f"serve_*_{tag}_c*")):
        j = load(f"{d.name}/bench.json")
        if j and j.get("points"):
            p = j["points"][0]
            s["serving"][d.name] = {"output_tokens_per_s": p["throughput"]["output_tokens_per_s"],
                                    "ttft_ms": p.get("ttft_ms"), "tpot_ms": p.get("tpot_ms")}
for kv, name in (("auto", "fp8_check_kvauto.json"), ("fp8", "fp8_check_kvfp8.json"),
                 ("smollm2", "fp8_check_smollm2.json")):
    c = load(name)
    if c:
        s["check"][f"weights fp8, kv {kv}" if kv != "smollm2" else "smollm2 real, weights fp8"] = {
            "pass": c.get("pass"), "positions": c.get("positions"), "candidate": c.get("candidate"),
            "metrics": {m["name"]: {"value": m["value"], "pass": m["pass"]} for m in c.get("metrics", [])}}
json.dump(s, open(out / "fp8_summary.json", "w"), indent=1)
print(json.dumps({"b1": {k: v.get("tokens_per_s_median") if isinstance(v, dict) else v for k, v in s["b1"].items()},
                  "batched": {b: {t: r.get("tokens_per_s") for t, r in row.items()} for b, row in s["batched"].items()},
                  "serving": {k: v["output_tokens_per_s"] for k, v in s["serving"].items()},
                  "check": {k: v["pass"] for k, v in s["check"].items()}}, indent=1))
PY
stamp "done"
