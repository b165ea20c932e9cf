#!/usr/bin/env bash
# What runs on the GPU machine, from the repo root, with .bundle/ (scripts/bundle.sh) carried along:
# nvidia-smi, the GPU-vs-CPU kernel tests (gtest XML to $OUT/gpu_tests.xml) and the microbenchmarks
# ($OUT/cuda_bench.jsonl); everything also goes to $OUT/log.txt. Takes about 1-2 minutes on an H200.
# Exit code: non-zero if the tests fail (the benchmarks still run). GPU_CHECK_QUICK=1: the gtest binaries only;
# RUN_SANITIZER=1: also compute-sanitizer memcheck (kernel and engine tests) and racecheck (kernel tests).
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
GEMM_CACHE="$OUT/gemm_cache.json"  # cuda_bench --gemm-cache

run() {
  echo "=== nvidia-smi"
  nvidia-smi || echo "nvidia-smi failed"
  echo "=== ldd check"
  for b in "$BUNDLE"/bin/*; do
    missing=$(ldd "$b" 2>&1 | grep "not found" || true)
    [[ -n "$missing" ]] && echo "$b: $missing"
  done
  if [[ -f /tmp/stoke_carry/manifest ]]; then  # a model carried in parts (scripts/split_for_device.sh)
    echo "=== joining the carried model parts"
    bash scripts/split_for_device.sh join || echo "join failed: the real-model tests will skip"
  fi
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
  # RUN_SANITIZER=1: compute-sanitizer memcheck (out-of-bounds and misaligned accesses, leaks of device
  # memory, API errors) over the kernel tests and the CudaLlama tests that use graphs, the GEMV and device
  # sampling, and racecheck (shared-memory hazards) over the kernels that use shared memory. Slow (10-50x):
  # filtered, each with its own time limit. Logs: $OUT/sanitizer_*.txt, $OUT/racecheck_kernels.txt.
  if [[ -n "${RUN_SANITIZER:-}" ]]; then
    local san; san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [[ -x "$san" ]]; then
      # sanitize NAME SECONDS LOG BINARY FILTER TOOL-ARGS...: one compute-sanitizer run, its tail and exit code.
      sanitize() {
        local name=$1 secs=$2 log=$3 bin=$4 filter=$5; shift 5
        echo "=== compute-sanitizer $name"
        timeout "$secs" "$san" "$@" --error-exitcode 3 "$BUNDLE/bin/$bin" --gtest_filter="$filter" > "$OUT/$log" 2>&1
        local rc=$?; tail -5 "$OUT/$log"; echo "=== $name exit $rc"
        [[ $rc == 0 ]] || test_rc=1
      }
      sanitize "memcheck (kernels)" 200 sanitizer_kernels.txt stoke_kernels_cuda_test \
        "${SANITIZER_KERNEL_FILTER:-*}" --tool memcheck --leak-check full
      sanitize "memcheck (engine: graphs, GEMV, device sampling)" 200 sanitizer_engine.txt stoke_engine_cuda_test \
        "${SANITIZER_ENGINE_FILTER:-CudaLlamaTest.DeviceSampled*:CudaLlamaTest.GraphsOn*}" --tool memcheck
      sanitize "racecheck (shared-memory kernels)" 240 racecheck_kernels.txt stoke_kernels_cuda_test \
        "${RACECHECK_FILTER:-CudaDecode*:CudaPrefill*:CudaEncoder*:CudaNorm*:CudaSampling*:CudaGemv*}" --tool racecheck
    else
      echo "=== compute-sanitizer not found: skipped"
    fi
  fi
  if [[ -n "${GPU_CHECK_QUICK:-}" ]]; then  # tests only: no generate/bench/synthetic/telemetry
    return $test_rc
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

  fp8_checkpoint_check || test_rc=1
  int8_encoder_check || test_rc=1

  echo "=== cuda_bench"
  timeout 150 "$BUNDLE/bin/cuda_bench" --gemm-cache "$GEMM_CACHE" > "$OUT/cuda_bench.jsonl"
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
  gpu_telemetry_check
  # ---- LLM parity and benchmark on synthetic models (tests/gpu, bench/gpu; opt-in, minutes) -------------
  # RUN_LLM_PARITY=1: transformers vs stoke --device cuda on a synthetic Llama-3.2-1B (~2 min)
  # RUN_LLM_BENCH=1: bench/gpu/llm_bench.sh on a synthetic Llama-3.1-8B (~7 min; run it on its own)
  if [[ -n "${RUN_LLM_PARITY:-}" ]]; then
    echo "=== tests/gpu/test_llama_parity.py"
    STOKE_BIN="$BUNDLE/bin/stoke" OUT="$OUT" timeout 420 python3 tests/gpu/test_llama_parity.py || test_rc=1
  fi
  if [[ -n "${RUN_LLM_BENCH:-}" ]]; then
    echo "=== bench/gpu/llm_bench.sh"
    STOKE_BIN="$BUNDLE/bin/stoke" OUT="$OUT" bench/gpu/llm_bench.sh || true
  fi
  return $test_rc
}

# --- Pre-quantised FP8 checkpoints on the GPU (docs/precision.md): a synthetic SmolLM2 shape (8 layers, bf16)
# written as FP8 checkpoints by tests/fixtures/fp8_checkpoint.py (numpy). The per-channel one must be what
# --quantization fp8 makes of the bf16 folder on the device (its codes and scales go up as they are and equal
# the device quantiser's: mean KL 0 expected, < 1e-3 required, top-1 >= 0.99); the per-tensor and per-block ones
# are reported against the bf16 folder. Reports: $OUT/fp8_checkpoint_*.json.
fp8_checkpoint_check() {
  local stoke="$BUNDLE/bin/stoke" dir="$OUT/fp8ck" rc=0
  [[ -x "$stoke" ]] || return 0
  python3 -c "import numpy" 2>/dev/null || { echo "=== FP8 checkpoints: no numpy, skipped"; return 0; }
  echo "=== FP8 checkpoints on cuda"
  rm -rf "$dir" && mkdir -p "$dir"
  "$stoke" model synth --shape smollm2-135m --layers 8 --quiet --out "$dir/bf16" || return 1
  for s in channel tensor block; do
    python3 tests/fixtures/fp8_checkpoint.py "$dir/bf16" "$dir/$s" --scales "$s" || return 1
  done
  local gate=(--device cuda --tokens 1024 --greedy-prompts 2 --greedy-tokens 16)
  timeout 120 "$stoke" model check --model "$dir/bf16" --quantization fp8 --reference "$dir/channel" "${gate[@]}" \
    --json "$OUT/fp8_checkpoint_channel_vs_in_engine.json"
  python3 - "$OUT/fp8_checkpoint_channel_vs_in_engine.json" <<'PY' || rc=1
import json, sys
r = {m["name"]: m["value"] for m in json.load(open(sys.argv[1]))["metrics"]}
ok = r["mean_kl"] < 1e-3 and r["top1_agreement"] >= 0.99
print("fp8 checkpoint (per-channel) vs --quantization fp8 on cuda:", r, "OK" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
  for s in channel tensor block; do
    timeout 120 "$stoke" model check --model "$dir/$s" --reference "$dir/bf16" "${gate[@]}" \
      --json "$OUT/fp8_checkpoint_${s}_vs_bf16.json" | tail -6
  done
  rm -rf "$dir"
  return $rc
}

# --- INT8 encoders on cuda (docs/precision.md): a random BERT-base (stoke model synth) calibrated on GPL-2 and
# gated on GPL-3 (`stoke model check --quantization int8`) on cuda and on the CPU reference, per-token (the
# default) and static activations. The device's figures must track the CPU's (mean cosine within 0.001); the
# verdicts themselves are what a random model gives. Reports: $OUT/int8_encoder_{cpu,cuda}_{per-token,static}.json.
int8_encoder_check() {
  local stoke="$BUNDLE/bin/stoke" dir="$OUT/int8_bert" rc=0 cal=/usr/share/common-licenses/GPL-2
  [[ -x "$stoke" && -f "$cal" ]] || { echo "=== INT8 encoder: no stoke or $cal, skipped"; return 0; }
  echo "=== INT8 encoder on cuda vs the CPU reference (random bert-base)"
  rm -rf "$dir"
  "$stoke" model synth --arch bert --shape bert-base --layers 4 --quiet --out "$dir" || return 1
  for a in per-token static; do
    for d in cpu cuda; do
      timeout 300 "$stoke" model check --model "$dir" --device "$d" --quantization int8 --calibration-data "$cal" \
        --int8-activations "$a" --json "$OUT/int8_encoder_${d}_${a}.json" | tail -4
    done
    python3 - "$OUT/int8_encoder_cpu_${a}.json" "$OUT/int8_encoder_cuda_${a}.json" "$a" <<'PY' || rc=1
import json, sys
cpu, cuda = ({m["name"]: m["value"] for m in json.load(open(f))["metrics"]} for f in sys.argv[1:3])
ok = cuda["mean_cosine"] >= cpu["mean_cosine"] - 1e-3
print(f"int8 encoder ({sys.argv[3]}): cpu {cpu}, cuda {cuda}:", "OK" if ok else "FAIL (cuda below the CPU reference)")
sys.exit(0 if ok else 1)
PY
  done
  rm -rf "$dir"
  return $rc
}

# --- GPU telemetry (NVML + GPM; docs/telemetry.md). Informational: never changes the exit code. ---------------
# Idle snapshot, a snapshot while cuda_bench loads the GPU (GPM ratios should be > 0), and `stoke serve`
# (synthetic model) exporting DCGM_FI_* on /metrics and GET /v1/gpu. Files: $OUT/gpu_telemetry*.json.
gpu_telemetry_check() {
  local stoke="$BUNDLE/bin/stoke"
  [[ -x "$stoke" ]] || { echo "=== GPU telemetry: no $stoke, skipped"; return 0; }
  echo "=== GPU telemetry: stoke gpu (idle)"
  timeout 60 "$stoke" gpu || echo "stoke gpu exit $?"
  timeout 60 "$stoke" gpu --json > "$OUT/gpu_telemetry_idle.json"; echo "stoke gpu --json exit $?"
  cat "$OUT/gpu_telemetry_idle.json"
  if [[ -x "$BUNDLE/bin/cuda_bench" ]]; then
    echo "=== GPU telemetry: stoke gpu --json --interval-ms 2000 while cuda_bench runs"
    "$BUNDLE/bin/cuda_bench" > /dev/null 2>&1 &
    local bench_pid=$!
    sleep 4
    timeout 60 "$stoke" gpu --json --interval-ms 2000 > "$OUT/gpu_telemetry_load.json"; echo "exit $?"
    kill "$bench_pid" 2>/dev/null; wait "$bench_pid" 2>/dev/null
    cat "$OUT/gpu_telemetry_load.json"
  fi
  echo "=== GPU telemetry: stoke serve /metrics and /v1/gpu"
  local dir; dir=$(mktemp -d)
  echo '{"type": "synthetic", "name": "synth", "input_bytes": 8, "output_bytes": 8}' > "$dir/synth.json"
  "$stoke" --log-level info serve --model "$dir/synth.json" --port 0 --grpc-port 0 \
    --gpu-telemetry-interval-ms 500 2> "$dir/serve.log" &
  local serve_pid=$!
  timeout 60 python3 - "$dir/serve.log" "$OUT/gpu_telemetry_serve.json" <<'PY' || echo "serve check failed"
import re, sys, time, urllib.request
log, out = sys.argv[1], sys.argv[2]
port = None
for _ in range(200):
    m = re.search(r"listening on http://[^:]+:(\d+)", open(log).read())
    if m:
        port = m.group(1)
        break
    time.sleep(0.1)
assert port, open(log).read()
time.sleep(2.5)  # a few ticks: GPM needs two samples
base = f"http://127.0.0.1:{port}"
metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
lines = [l for l in metrics.splitlines() if l.startswith(("DCGM_FI_", "stoke_gpu"))]
print("\n".join(lines))
print(f"{len(lines)} GPU series; PROF present: {any(l.startswith('DCGM_FI_PROF_') for l in lines)}")
open(out, "w").write(urllib.request.urlopen(base + "/v1/gpu", timeout=10).read().decode())
PY
  kill -TERM "$serve_pid" 2>/dev/null; wait "$serve_pid" 2>/dev/null
  grep -i "telemetry" "$dir/serve.log" || true
  cat "$OUT/gpu_telemetry_serve.json" 2>/dev/null; echo
  rm -rf "$dir"
  return 0
}
run 2>&1 | tee "$OUT/log.txt"
