#!/usr/bin/env bash
# What runs on the GPU machine, from the repo root, with .bundle/ (scripts/bundle.sh) carried along:
# nvidia-smi, the GPU-vs-CPU kernel tests (gtest XML to $OUT/gpu_tests.xml) and the microbenchmarks
# ($OUT/cuda_bench.jsonl); everything also goes to $OUT/log.txt. Takes about 1-2 minutes on an H200.
# Exit code: non-zero if the tests fail (the benchmarks still run).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
BUNDLE=${BUNDLE:-.bundle}
if [[ -d /usr/local/cuda/lib64 ]]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export STOKE_GEMM_CACHE="$OUT/gemm_cache.json"

run() {
  echo "=== nvidia-smi"
  nvidia-smi || echo "nvidia-smi failed"
  echo "=== ldd check"
  for b in "$BUNDLE"/bin/*; do
    missing=$(ldd "$b" 2>&1 | grep "not found" || true)
    [[ -n "$missing" ]] && echo "$b: $missing"
  done
  echo "=== stoke_kernels_cuda_test"
  timeout 240 "$BUNDLE/bin/stoke_kernels_cuda_test" --gtest_output="xml:$OUT/gpu_tests.xml"
  local test_rc=$?
  echo "=== stoke_kernels_cuda_test exit $test_rc"
  if [[ -x "$BUNDLE/bin/stoke_device_test" ]]; then
    echo "=== stoke_device_test"
    timeout 60 "$BUNDLE/bin/stoke_device_test" --gtest_output="xml:$OUT/gpu_device_tests.xml" || test_rc=1
  fi
  # --- CudaLlama (engine/cuda): the decoder on the GPU against CpuLlama, then the CLI end to end.
  if [[ -x "$BUNDLE/bin/stoke_engine_cuda_test" ]]; then
    echo "=== stoke_engine_cuda_test"
    timeout 300 "$BUNDLE/bin/stoke_engine_cuda_test" --gtest_output="xml:$OUT/gpu_engine_tests.xml" || test_rc=1
  fi
  if [[ -x "$BUNDLE/bin/stoke" ]] && "$BUNDLE/bin/stoke" model synth --help >/dev/null 2>&1; then
    echo "=== stoke generate --device cuda vs cpu (synth smollm2-135m, 4 layers)"
    local synth="$OUT/synth_smollm2"
    rm -rf "$synth"
    if "$BUNDLE/bin/stoke" model synth --arch llama --shape smollm2-135m --layers 4 --out "$synth" >/dev/null; then
      local gen=(generate --model "$synth" --ids '[1, 504, 3101, 282, 4649, 314]' --max-tokens 24 --temperature 0
                 --ignore-eos --print-ids --verbose)
      "$BUNDLE/bin/stoke" "${gen[@]}" --device cpu >/dev/null 2>"$OUT/gen_cpu.txt"
      "$BUNDLE/bin/stoke" "${gen[@]}" --device cuda >/dev/null 2>"$OUT/gen_cuda.txt" || test_rc=1
      "$BUNDLE/bin/stoke" "${gen[@]}" --device cuda --cuda-graphs off >/dev/null 2>"$OUT/gen_cuda_nographs.txt" ||
        test_rc=1
      cat "$OUT/gen_cpu.txt" "$OUT/gen_cuda.txt" "$OUT/gen_cuda_nographs.txt"
      ids() { grep '^{"prompt"' "$1"; }
      [[ "$(ids "$OUT/gen_cuda.txt")" == "$(ids "$OUT/gen_cuda_nographs.txt")" ]] ||
        { echo "generate: cuda graphs on/off differ"; test_rc=1; }
      [[ "$(ids "$OUT/gen_cuda.txt")" == "$(ids "$OUT/gen_cpu.txt")" ]] ||
        echo "generate: cuda and cpu greedy ids differ (bf16 vs fp32: look at where)"
    fi
  fi

  echo "=== cuda_bench"
  timeout 150 "$BUNDLE/bin/cuda_bench" > "$OUT/cuda_bench.jsonl"
  echo "=== cuda_bench exit $?"
  cat "$OUT/cuda_bench.jsonl"
  if [[ -x "$BUNDLE/bin/stoke" ]]; then
    echo "=== stoke --version"
    "$BUNDLE/bin/stoke" --version || true
  fi
  return $test_rc
}
run 2>&1 | tee "$OUT/log.txt"
