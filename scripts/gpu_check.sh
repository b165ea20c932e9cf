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
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
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
  # --- CUDA BERT encoder (engine/cuda/cuda_bert_gpu_test.cc); the BERT bench is separate: bench/gpu/bert_bench.sh
  if [[ -x "$BUNDLE/bin/stoke_engine_cuda_test" ]]; then
    echo "=== stoke_engine_cuda_test CudaBert*"
    timeout 180 "$BUNDLE/bin/stoke_engine_cuda_test" --gtest_filter='CudaBert*' \
      --gtest_output="xml:$OUT/gpu_cuda_bert_tests.xml" || test_rc=1
  fi
  # --- end CUDA BERT
  echo "=== cuda_bench"
  timeout 150 "$BUNDLE/bin/cuda_bench" > "$OUT/cuda_bench.jsonl"
  echo "=== cuda_bench exit $?"
  cat "$OUT/cuda_bench.jsonl"
  # --- the synthetic model on the GPU (engine/cuda_synthetic; examples/synthetic) ---
  if [[ -x "$BUNDLE/bin/stoke_synthetic_cuda_test" ]]; then
    echo "=== stoke_synthetic_cuda_test"
    timeout 180 "$BUNDLE/bin/stoke_synthetic_cuda_test" --gtest_output="xml:$OUT/gpu_synthetic_tests.xml" || test_rc=1
  fi
  if [[ -x "$BUNDLE/bin/stoke" ]]; then
    echo "=== synthetic model served on the GPU ($OUT/synthetic_serve.jsonl)"
    timeout 300 python3 tests/gpu/synthetic_serve_check.py --stoke "$BUNDLE/bin/stoke" --out "$OUT" || test_rc=1
  fi
  # --- end synthetic ---
  if [[ -x "$BUNDLE/bin/stoke" ]]; then
    echo "=== stoke --version"
    "$BUNDLE/bin/stoke" --version || true
  fi
  return $test_rc
}
run 2>&1 | tee "$OUT/log.txt"
