#!/usr/bin/env bash
# Batch-1 decode and prefill, stoke beside llama.cpp CUDA on the same GGUF files, in one call on the GPU machine
# (issue 16's rows "decode batch 1, bf16", "decode batch 1, Q8_0 GGUF" and "prefill 512", and Q4_K_M, the most
# common GGUF mix: Q4_K with Q6_K for attn_v / ffn_down / output):
#   1. llama.cpp's build started in the background (bench/gpu/llama_cpp.sh build-start: ~4-5 min on 16 cores)
#   2. stoke model synth --shape llama-3.1-8b (random bf16), the CUDA kernel/engine tests of the GGUF GEMVs
#   3. the synth folder -> bf16 GGUF -> Q8_0 and Q4_K_M GGUFs (bench/gpu/llama_cpp.sh convert; llama-quantize)
#   4. stoke bench step (batch 1, context 512, 2048-token prefill) on the safetensors folder, the bf16 GGUF and
#      the Q8_0 GGUF, and batch 8 on the Q8_0 GGUF with --gemv-max-rows 8; llama-bench (tg128, pp512) on both
#      GGUFs; then stoke on the Q8_0 and bf16 GGUFs again (a second process each: drift between processes);
#      stoke bench step and llama-bench on the Q4_K_M GGUF (stoke with --kquant-gemv auto, the default, fp32 and
#      int8)
#   5. $OUT/decode_peer_summary.json: tok/s of each, stoke / llama.cpp ratios
#   6. the per-step split at batch 1 (Q8_0 GGUF, bf16): each decode kernel timed by Nsight Compute (ncu_split)
# Knobs (env): OUT [/tmp/stoke_gpu_out], DP_ITERS [40] (timed decode steps per stoke run), DP_SKIP_TESTS=1, DP_SKIP_NCU=1,
# DP_QUICK=1 (one stoke run per GGUF and llama-bench on each: no safetensors run, repeats, batch 8 or context 4096;
# fits one 10-minute device command from a cold start),
# LLAMA_BENCH_R [3] (llama-bench repetitions), and those of llama_cpp.sh. About 9-10 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
BUNDLE=${BUNDLE:-.bundle}
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
STOKE=${STOKE_BIN:-$BUNDLE/bin/stoke}
if [[ -d /usr/local/cuda/lib64 ]]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export OUT LLAMA_BENCH_R=${LLAMA_BENCH_R:-3} SKIP_BATCHED=${SKIP_BATCHED:-1}
SHAPE=llama-3.1-8b
MODEL=${LLM_MODEL_DIR:-/tmp/stoke_synth_$SHAPE}
GGUF_DIR=${LLAMA_GGUF_DIR:-/tmp/stoke_gguf}
NAME=$(basename "$MODEL")
BF16_GGUF=$GGUF_DIR/$NAME-bf16.gguf
Q8_GGUF=$GGUF_DIR/$NAME-q8_0.gguf
Q4K_GGUF=$GGUF_DIR/$NAME-q4_k_m.gguf
export LLAMA_QUANTS=${LLAMA_QUANTS-q8_0 q4_k_m}
ITERS=${DP_ITERS:-40}
GEMM_CACHE=$OUT/gemm_cache.json
T0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }

step() {  # step TAG MODEL [more bench step flags]
  local tag=$1 model=$2
  shift 2
  stamp "stoke bench step $tag"
  timeout 150 "$STOKE" bench step --model "$model" --device cuda --gemm-cache "$GEMM_CACHE" --iters "$ITERS" \
    --json "$OUT/step_$tag.json" "$@" > "$OUT/step_$tag.log" 2>&1 || echo "bench step $tag failed: exit $?"
  grep -E "decode|prefill" "$OUT/step_$tag.log" | tail -n 3
}

# The per-step split at batch 1: every kernel of a few decode steps timed by Nsight Compute (graphs off, so each
# kernel is its own launch; ncu serialises them, so the sum leaves out the gaps between kernels that the
# step time includes). $OUT/ncu_TAG.csv raw, $OUT/ncu_TAG_split.json per kernel name: count/step, us/step.
ncu_split() {  # ncu_split TAG MODEL
  local tag=$1 model=$2 ncu
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n "$ncu" ]] || { echo "no ncu"; return 0; }
  stamp "ncu per-kernel split $tag"
  timeout 200 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$STOKE" bench step --model "$model" --device cuda --gemm-cache "$GEMM_CACHE" --decode-batch 1 --context 512 \
    --prefill 0 --warmup 1 --iters 3 --cuda-graphs off > "$OUT/ncu_$tag.csv" 2> "$OUT/ncu_$tag.log" ||
    echo "ncu $tag failed: exit $?"
  python3 - "$OUT/ncu_$tag.csv" "$OUT/ncu_${tag}_split.json" <<'PY'
import csv, json, re, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows: sys.exit("no ncu rows")
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value")
def name(s):  # "void stoke::<unnamed>::GemvKernel<1, float, 0, 1, 2>(...)" -> "GemvKernel<1, float, 0, 1, 2>"
    s = s.replace("stoke::<unnamed>::", "").replace("void ", "")
    m = re.match(r"(\w+)(<[^(]*>)?", s)
    return m.group(1) + (m.group(2) or "") if m else s[:40]
ks = [(name(r[ki]), float(r[vi].replace(",", ""))) for r in rows[1:] if r[vi]]
# A decode step starts at its embedding gather; the first gather is the prompt's prefill, dropped. cuBLASLt
# kernels (nvjet_*) in a decode segment are the GEMM tuning of the load, not the step: dropped too.
idx = [i for i, (n, _) in enumerate(ks) if n.startswith("EmbeddingKernel")]
steps = [ks[a:b] for a, b in zip(idx[1:], idx[2:] + [len(ks)])]
agg = {}
for seg in steps:
    for n, ns in seg:
        if n.startswith("nvjet"): continue
        d = agg.setdefault(n, [0, 0.0]); d[0] += 1; d[1] += ns
S = max(len(steps), 1)
out = {"steps": len(steps), "kernels": {n: {"per_step": c / S, "us_per_step": ns / S / 1e3, "us_each": ns / c / 1e3}
                                        for n, (c, ns) in sorted(agg.items(), key=lambda kv: -kv[1][1])}}
out["total_us_per_step"] = sum(v["us_per_step"] for v in out["kernels"].values())
out["gemv_us_per_step"] = sum(v["us_per_step"] for n, v in out["kernels"].items() if "Gemv" in n)
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(json.dumps(out, indent=1)[:2500])
PY
}

main() {
  stamp "llama.cpp build (background)"
  bash bench/gpu/llama_cpp.sh build-start
  stamp "synth $SHAPE"
  [[ -f "$MODEL/config.json" ]] || timeout 300 "$STOKE" model synth --shape "$SHAPE" --seed 1 --out "$MODEL" --quiet ||
    { echo "synth failed"; return 1; }
  stamp "convert to GGUF (background: bf16 now, $LLAMA_QUANTS once llama-quantize is built)"
  bash bench/gpu/llama_cpp.sh convert "$MODEL" > "$OUT/convert.log" 2>&1 &
  local convert_pid=$!
  if [[ -z "${DP_SKIP_TESTS:-}" ]]; then
    stamp "GPU tests: the GGUF GEMVs (Q8_0, Q4_1, Q4_K, Q6_K) and the decoder over GGUF files"
    timeout 120 "$BUNDLE/bin/stoke_kernels_cuda_test" --gtest_filter='CudaQuant*:CudaGemv*:CudaFp8.Gemv*:CudaFp8.SiluMul*' \
      > "$OUT/q8_kernels_test.log" 2>&1; echo "kernels test exit $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/q8_kernels_test.log"
    timeout 120 "$BUNDLE/bin/stoke_engine_cuda_test" --gtest_filter='CudaLlamaTest.Gguf*:CudaLlamaTest.Graphs*:CudaBertTest.*' \
      > "$OUT/q8_engine_test.log" 2>&1; echo "engine test exit $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/q8_engine_test.log"
  fi
  [[ -z "${DP_QUICK:-}" ]] && step st_bf16 "$MODEL" --decode-batch 1 --context 512 --prefill 2048
  stamp "waiting for the GGUF files"
  wait "$convert_pid"
  tail -n 5 "$OUT/convert.log"
  ls -la "$GGUF_DIR"
  [[ -f "$Q8_GGUF" ]] || { echo "no Q8_0 GGUF"; tail -n 30 "$OUT/llama_cpp_build.log"; }
  step q8_b1 "$Q8_GGUF" --decode-batch 1 --context 512 --prefill 512
  step bf16gguf_b1 "$BF16_GGUF" --decode-batch 1 --context 512 --prefill 512
  stamp "llama-bench Q8_0"
  LLAMA_BENCH_P=512 LLAMA_BENCH_N=128 timeout 150 bash bench/gpu/llama_cpp.sh bench "$Q8_GGUF" q8_0 > "$OUT/llama_bench_q8_0.log" 2>&1
  tail -n 4 "$OUT/llama_bench_q8_0.log"
  stamp "llama-bench bf16"
  LLAMA_BENCH_P=512 LLAMA_BENCH_N=128 timeout 150 bash bench/gpu/llama_cpp.sh bench "$BF16_GGUF" bf16 > "$OUT/llama_bench_bf16.log" 2>&1
  tail -n 4 "$OUT/llama_bench_bf16.log"
  if [[ -z "${DP_QUICK:-}" ]]; then
    step q8_b1_r2 "$Q8_GGUF" --decode-batch 1 --context 512 --prefill 0
    step q8_b8 "$Q8_GGUF" --decode-batch 8 --context 512 --prefill 0 --gemv-max-rows 8
    step q8_b1_ctx4096 "$Q8_GGUF" --decode-batch 1 --context 4096 --prefill 0
    step bf16gguf_b1_r2 "$BF16_GGUF" --decode-batch 1 --context 512 --prefill 0
  fi
  if [[ -f "$Q4K_GGUF" ]]; then
    step q4k_b1 "$Q4K_GGUF" --decode-batch 1 --context 512 --prefill 512
    # the K-quant GEMV with int8 activations (--kquant-gemv int8: the CPU engine's and llama.cpp's numerics)
    step q4k_int8_b1 "$Q4K_GGUF" --decode-batch 1 --context 512 --prefill 0 --kquant-gemv int8
    step q4k_fp32_b1 "$Q4K_GGUF" --decode-batch 1 --context 512 --prefill 0 --kquant-gemv fp32
    stamp "llama-bench Q4_K_M"
    LLAMA_BENCH_P=512 LLAMA_BENCH_N=128 timeout 150 bash bench/gpu/llama_cpp.sh bench "$Q4K_GGUF" q4_k_m > "$OUT/llama_bench_q4_k_m.log" 2>&1
    tail -n 4 "$OUT/llama_bench_q4_k_m.log"
    [[ -z "${DP_QUICK:-}" ]] && step q4k_b1_r2 "$Q4K_GGUF" --decode-batch 1 --context 512 --prefill 0
  else
    echo "no Q4_K_M GGUF"
  fi
  if [[ -z "${DP_SKIP_NCU:-}" ]]; then
    ncu_split q8 "$Q8_GGUF"
    [[ -f "$Q4K_GGUF" ]] && ncu_split q4k "$Q4K_GGUF"
    ncu_split bf16 "$MODEL"
  fi
  stamp "summary"
  python3 - "$OUT" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
def step(tag):
    try:
        d = json.load(open(f"{out}/step_{tag}.json"))
    except Exception as e:
        return {"error": str(e)}
    r = {"commit": d.get("commit"), "engine": d.get("engine", {}).get("quantization")}
    dec = d.get("decode") or {}
    pre = d.get("prefill") or {}
    for k in ("tokens_per_s", "achieved_gbps", "hbm_roofline_fraction", "weight_bytes_per_step"):
        if k in dec: r["decode_" + k] = dec[k]
    if "step_ms" in dec: r["decode_step_ms_median"] = dec["step_ms"]["median"]
    if "tokens_per_s" in pre: r["prefill_tokens_per_s"] = pre["tokens_per_s"]
    if "ms" in pre: r["prefill_ms_median"] = pre["ms"]["median"]
    return r
def lcpp(tag):
    try:
        return json.load(open(f"{out}/llama_cpp_{tag}/summary.json"))
    except Exception as e:
        return {"error": str(e)}
s = {"stoke": {t: step(t) for t in ("st_bf16", "q8_b1", "bf16gguf_b1", "q8_b1_r2", "q8_b8", "q8_b1_ctx4096", "bf16gguf_b1_r2",
                                     "q4k_b1", "q4k_int8_b1", "q4k_fp32_b1", "q4k_b1_r2")},
     "llama_cpp": {"q8_0": lcpp("q8_0"), "bf16": lcpp("bf16"), "q4_k_m": lcpp("q4_k_m")}}
json.dump(s, open(f"{out}/decode_peer_summary.json", "w"), indent=1)
print(json.dumps(s, indent=1)[:6000])
EOF
  stamp "done"
}
main 2>&1 | tee "$OUT/decode_peer.log"
