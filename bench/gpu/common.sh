# Sourced by GPU bench scripts (bench/gpu/llm_bench.sh, llm_loads.sh, decode_attention.sh, fp8.sh,
# precision.sh) from the repo root: the bundle,
# the output folder, the CUDA library path, progress stamps and the synthetic Llama-shaped model.
#   bench_setup [BIN_ARG]   sets OUT (made), BIN, STOKE, SHAPE, MODEL, LAYERS_ARG, T0. BIN_ARG: a folder of
#                           binaries, or the stoke binary itself (a CPU dry run); empty: .bundle/bin (the
#                           .bundle.tar.gz the device tool carried is unpacked first)
#   stamp MESSAGE           "=== [seconds since bench_setup] MESSAGE"
#   synth_model LOG         stoke model synth --shape $SHAPE --seed 1 into $MODEL unless it is there
#   http_get URL            the body on stdout (python: GPU hosts may lack curl); status 1 on any error
#   doctor_watch URL WARMUP DURATION TAG [RATES]
#                           in the background, `stoke doctor --load none` over the middle 80 % of a measured
#                           window that begins WARMUP s from now and lasts DURATION s (a `stoke bench` started
#                           right after): verdict and per-step split in TAG.json, its report in TAG.txt; RATES
#                           (e.g. "--hbm-gbps 4200 --tensor-tflops 700") times each part at those rates. Sets
#                           DOCTOR_PID (wait on it after the bench)
#   serve_url LOG PID       waits for the `stoke serve` (PID, stderr in LOG) to listen and be ready; prints its
#                           http://127.0.0.1:PORT, or the log's tail and status 1 when it never does or exits
# Knobs (env): OUT, BUNDLE, STOKE_BIN, LLM_SHAPE (llama-3.1-8b), LLM_LAYERS, LLM_MODEL_DIR.
bench_setup() {
  local bin_arg=${1:-}
  OUT=${OUT:-/tmp/stoke_gpu_out}
  mkdir -p "$OUT"
  BUNDLE=${BUNDLE:-.bundle}
  if [[ -z "$bin_arg" && ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
  BIN=${bin_arg:-$BUNDLE/bin}
  STOKE=${STOKE_BIN:-$BIN/stoke}
  [[ -x "$STOKE" ]] || STOKE=$BIN
  if [[ -d /usr/local/cuda/lib64 ]]; then
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  SHAPE=${LLM_SHAPE:-llama-3.1-8b}
  MODEL=${LLM_MODEL_DIR:-/tmp/stoke_synth_$SHAPE${LLM_LAYERS:+_l$LLM_LAYERS}}
  LAYERS_ARG=()
  [[ -n "${LLM_LAYERS:-}" ]] && LAYERS_ARG=(--layers "$LLM_LAYERS")
  T0=$(date +%s)
}

stamp() { echo "=== [$(($(date +%s) - T0)) s] $*"; }

synth_model() {
  stamp "synth $SHAPE -> $MODEL"
  if [[ -f "$MODEL/config.json" ]] && grep -q "\"shape\": \"$SHAPE\"" "$MODEL/config.json"; then
    echo "reusing $MODEL"
    return 0
  fi
  timeout 300 "$STOKE" model synth --shape "$SHAPE" --seed 1 --out "$MODEL" "${LAYERS_ARG[@]}" > "$1" 2>&1 ||
    { echo "synth failed"; tail -5 "$1"; return 1; }
}

http_get() {
  python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" \
    "$1" 2>/dev/null
}

doctor_watch() {
  local url=$1 warm=$2 dur=$3 tag=$4 rates=${5:-}
  local ddur=$(( dur * 8 / 10 > 1 ? dur * 8 / 10 : 1 ))
  # shellcheck disable=SC2086  # rates is a word list
  ( sleep "$warm"; sleep 2; timeout $(( ddur + 60 )) "$STOKE" doctor --url "$url" --load none --duration "$ddur" \
      --trace off $rates --quiet --json "$tag.json" > "$tag.txt" 2>&1 ||
      echo "stoke doctor $(basename "$tag") failed: exit $?" ) &
  # shellcheck disable=SC2034  # read by the scripts that source this file
  DOCTOR_PID=$!
}

serve_url() {
  local log=$1 pid=$2 port="" url
  for _ in $(seq 1 600); do
    port=$(grep -oE 'listening on http://[^:]+:[0-9]+' "$log" | head -1 | grep -oE '[0-9]+$' || true)
    [[ -n "$port" ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  [[ -n "$port" ]] || { echo "stoke serve did not start:" >&2; tail -30 "$log" >&2; return 1; }
  url=http://127.0.0.1:$port
  local ready=""
  for _ in $(seq 1 600); do
    http_get "$url/health/ready" >/dev/null && { ready=1; break; }
    # It listens before loading the models: one refused at load (e.g. by the precision gate) ends the process.
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  [[ -n "$ready" ]] || { echo "stoke serve never became ready:" >&2; tail -30 "$log" >&2; return 1; }
  echo "$url"
}
