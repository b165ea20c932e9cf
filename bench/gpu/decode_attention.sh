#!/usr/bin/env bash
# Issue 16, decode attention on tensor cores (--decode-attention tiled) against the warp kernel, on the GPU
# machine from the repo root with the bundle (scripts/bundle.sh) carried along:
#   1. tests   stoke_kernels_cuda_test CudaDecode* / CudaQuantDecode* / CudaPrefill* (the tiled kernels,
#              both tiled forms over 8-bit caches included, vs the CPU: every group
#              size to 16, head_dim 64/128, contexts 0..4100) and stoke_engine_cuda_test CudaLlamaTest.* (the
#              whole decoder with the tiled kernel vs the CPU)
#   2. kernel  cuda_bench --only decode_attn: both kernels on the Llama-3.1-8B attention shape, batch 1..256
#   3. step    stoke bench step on the Llama-3.1-8B shape (random weights, stoke model synth): decode steps at
#              batch 1 (context 512, 4096), 64 and 256 (context 1000), warp and tiled alternated, DA_REPS rounds,
#              for each KV cache dtype of DA_KV
#   4. $OUT/decode_attention_summary.json: per point the decode tok/s of each kernel, tiled / warp and (with
#      DA_KERNELS including tiled-smem, an 8-bit DA_KV) tiled / tiled-smem
# The 8-bit A/B of the two tiled forms (registers, the default, against shared-memory widening):
# DA_KV="fp8" DA_KERNELS="tiled-smem tiled" DA_POINTS="64:1000 256:1000".
# The cp.async pipeline depth of the 8-bit fragment kernel (--decode-stages): DA_KERNELS="tiled tiled:3 tiled:4"
# (KERNEL:STAGES; tagged tiled-s3 / tiled-s4, summarised as tiled_s3_over_tiled); DA_STEP_ARGS: more bench step
# flags for every run (e.g. "--quantization fp8 --allow-inconsistent").
# Usage: bench/gpu/decode_attention.sh [BIN_DIR] (default .bundle/bin). Knobs (env): DA_PARTS ("tests kernel
# step"), DA_REPS (2), DA_ITERS (30), DA_POINTS ("1:512 1:4096 64:1000 256:1000", batch:context), DA_KV
# ("bf16"; e.g. "bf16 fp8": --kv-cache-dtype per run), DA_KERNELS ("warp tiled"), LLM_SHAPE, LLM_LAYERS.
# CPU dry run of the plumbing (the flag is accepted, the cpu ignores it): DA_DEVICE=cpu DA_PARTS=step
#   LLM_SHAPE=smollm2-135m LLM_LAYERS=2 DA_POINTS=2:64 DA_ITERS=2 DA_REPS=1 bench/gpu/decode_attention.sh \
#   build/release/apps/stoke
set -uo pipefail
BIN_ARG=${1:+$(realpath "$1")}
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=bench/gpu/common.sh
source bench/gpu/common.sh
bench_setup "$BIN_ARG"
REPS=${DA_REPS:-2}
ITERS=${DA_ITERS:-30}
POINTS=${DA_POINTS:-"1:512 1:4096 64:1000 256:1000"}
DEVICE=${DA_DEVICE:-cuda}
GEMM_CACHE=${GEMM_CACHE:-$OUT/gemm_cache.json}
PARTS=" ${DA_PARTS:-tests kernel step} "
want() { [[ $PARTS == *" $1 "* ]]; }

if want tests; then
  stamp "gpu tests: attention kernels"
  timeout 240 "$BIN/stoke_kernels_cuda_test" --gtest_filter='CudaDecode*:CudaQuantDecode*:CudaPrefill*:CudaAttention*' \
    > "$OUT/da_kernels_test.log" 2>&1
  echo "stoke_kernels_cuda_test attention: exit $?"; grep -E 'FAILED|PASSED|Failure' "$OUT/da_kernels_test.log" | tail -20
  stamp "gpu tests: CudaLlamaTest.*"
  timeout 300 "$BIN/stoke_engine_cuda_test" --gtest_filter='CudaLlamaTest.*' > "$OUT/da_engine_test.log" 2>&1
  echo "stoke_engine_cuda_test CudaLlamaTest: exit $?"; grep -E 'FAILED|PASSED|Failure' "$OUT/da_engine_test.log" | tail -20
fi

if want kernel; then
  stamp "cuda_bench --only decode_attn"
  timeout 120 "$BIN/cuda_bench" --only decode_attn > "$OUT/da_kernel_bench.jsonl" 2> "$OUT/da_kernel_bench.err"
  echo "cuda_bench: exit $?"; cat "$OUT/da_kernel_bench.jsonl"
fi

if want step; then
  synth_model "$OUT/da_synth.log" || exit 1
  mkdir -p "$OUT/da_step"
  for r in $(seq 1 "$REPS"); do
    for pt in $POINTS; do
      b=${pt%%:*} ctx=${pt##*:}
      for kv in ${DA_KV:-bf16}; do
        for k in ${DA_KERNELS:-warp tiled}; do
          # KERNEL or KERNEL:STAGES (--decode-stages; tag KERNEL-sSTAGES)
          kern=${k%%:*} stages=2 label=${k%%:*}
          if [[ $k == *:* ]]; then stages=${k#*:} label="${kern}-s${stages}"; fi
          tag="b${b}_c${ctx}_kv${kv}_${label}_r$r"
          stamp "bench step $tag"
          timeout 200 "$STOKE" bench step --model "$MODEL" --device "$DEVICE" --gemm-cache "$GEMM_CACHE" \
            --prefill 0 --iters "$ITERS" --decode-batch "$b" --context "$ctx" --decode-attention "$kern" \
            --decode-stages "$stages" --kv-cache-dtype "$kv" --json "$OUT/da_step/$tag.json" \
            ${DA_STEP_ARGS:-} > "$OUT/da_step/$tag.log" 2>&1 ||
            { echo "bench step $tag failed: exit $?"; tail -5 "$OUT/da_step/$tag.log"; }
          grep -E 'decode median' "$OUT/da_step/$tag.log" | head -1 | sed 's/^/  /'
        done
      done
    done
  done
  python3 - "$OUT" <<'EOF'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "da_step", "*.json"))):
    m = re.match(r"b(\d+)_c(\d+)_kv(\w+?)_(warp|tiled-smem|tiled(?:-s\d)?)_r(\d+)\.json", os.path.basename(f))
    if not m:
        continue
    d = json.load(open(f))
    dec = d.get("decode") or {}
    tps = dec.get("tokens_per_s")
    ms = (dec.get("step_ms") or {}).get("median")
    key = f"batch {m[1]}, context {m[2]}, kv {m[3]}"
    rows.setdefault(key, {})
    rows[key].setdefault(m[4], []).append(tps)
    rows[key].setdefault(m[4] + "_step_ms", []).append(ms)
for key, r in rows.items():
    med = {k: statistics.median([x for x in r.get(k, []) if x])
           for k in ("warp", "tiled", "tiled-smem", "tiled-s3", "tiled-s4") if [x for x in r.get(k, []) if x]}
    if "warp" in med and "tiled" in med:
        r["tiled_over_warp"] = round(med["tiled"] / med["warp"], 3)
    if "tiled" in med and "tiled-smem" in med:
        r["tiled_over_tiled_smem"] = round(med["tiled"] / med["tiled-smem"], 3)
    for st in ("tiled-s3", "tiled-s4"):
        if "tiled" in med and st in med:
            r[st.replace("-", "_") + "_over_tiled"] = round(med[st] / med["tiled"], 3)
kernel = []
p = os.path.join(out, "da_kernel_bench.jsonl")
if os.path.exists(p):
    kernel = [json.loads(l) for l in open(p) if l.startswith("{")]
summary = {"decode_step_tok_s": rows, "kernel": kernel}
json.dump(summary, open(os.path.join(out, "decode_attention_summary.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
EOF
fi
stamp "done"
