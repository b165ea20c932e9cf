#!/usr/bin/env bash
# llama.cpp as a measured peer of stoke on the GPU machine, on the same (synthetic) weights. Run from the repo
# root of the unpacked bundle; the source comes from peers/llama.cpp.tar.xz (or $BUNDLE/peers/), made here by
# bench/gpu/llama_cpp_pack.sh (pruned vendor/llama.cpp of the llama-cpp-python sdist, no network needed).
#
#   bench/gpu/llama_cpp.sh build-start       unpack + configure + build in the background (log: $OUT/llama_cpp_build.log)
#   bench/gpu/llama_cpp.sh build-wait        wait for that build; its exit status (0: the four tools are there)
#   bench/gpu/llama_cpp.sh build             both, in the foreground
#   bench/gpu/llama_cpp.sh configure         unpack + configure only (checks the CUDA toolchain without building)
#   bench/gpu/llama_cpp.sh convert [SYNTH]   synth HF folder -> $LLAMA_GGUF_DIR/<name>-bf16.gguf (gguf_from_hf.py)
#                                            and <name>-q8_0.gguf (llama-quantize; waits for the build)
#   bench/gpu/llama_cpp.sh bench GGUF [TAG]  llama-bench pp/tg + llama-batched-bench -> $OUT/llama_cpp_<TAG>/summary.json
#   bench/gpu/llama_cpp.sh server GGUF       llama-server in the background on $LLAMA_SERVER_PORT; prints its URL
#   bench/gpu/llama_cpp.sh server-bench GGUF server + `stoke bench` at $LLAMA_SERVER_CONCURRENCY, as llm_bench.sh
#                                            does for stoke serve -> $OUT/llama_cpp_serve_<TAG>_c<N>/bench.json
#   bench/gpu/llama_cpp.sh server-stop       stops the server started by `server`
#   bench/gpu/llama_cpp.sh all               build-start; synth (stoke model synth, skipped when present);
#                                            convert; bench bf16 and q8_0 -> $OUT/llama_cpp_summary.json
#                                            (about 10 minutes on an H200 for 8B)
#
# Here, before the bundle is made: bench/gpu/llama_cpp_pack.sh && scripts/bundle.sh (.bundle/peers/llama.cpp.tar.xz,
# ~3 MB; or carry peers/llama.cpp.tar.xz itself). On the GPU machine, from the repo root:
#   bench/gpu/llama_cpp.sh build-start                       # ~4-5 min on 16 cores, meanwhile:
#   .bundle/bin/stoke model synth --shape llama-3.1-8b --seed 1 --out /tmp/stoke_synth_llama-3.1-8b
#   bench/gpu/llama_cpp.sh convert /tmp/stoke_synth_llama-3.1-8b   # bf16 GGUF now, waits for the build for Q8_0
#   bench/gpu/llama_cpp.sh bench /tmp/stoke_gguf/stoke_synth_llama-3.1-8b-bf16.gguf bf16
#   bench/gpu/llama_cpp.sh bench /tmp/stoke_gguf/stoke_synth_llama-3.1-8b-q8_0.gguf q8_0
# (or simply `bench/gpu/llama_cpp.sh all`). Each bench writes $OUT/llama_cpp_<TAG>/: llama_bench.json (raw -o json),
# batched_bench.jsonl (raw), commands.txt (the exact command lines), summary.json (tok/s per row).
#
# Knobs (env, defaults in brackets):
#   OUT [/tmp/stoke_gpu_out]  BUNDLE [.bundle]  STOKE_BIN [$BUNDLE/bin/stoke]
#   LLAMA_CPP_TARBALL [peers/llama.cpp.tar.xz, else $BUNDLE/peers/llama.cpp.tar.xz]
#   LLAMA_CPP_DIR [/tmp/llama.cpp-peer]: the source unpacks to $LLAMA_CPP_DIR/llama.cpp, builds in $LLAMA_CPP_DIR/build
#   LLAMA_CPP_CUDA [1] (0: a CPU-only build, to test this script on a machine without a GPU)
#   LLAMA_CPP_CUDA_ARCH [90]  LLAMA_CPP_JOBS [nproc]  LLAMA_CPP_CMAKE_ARGS [] (more -D flags)
#   LLAMA_CPP_TARGETS [llama-bench llama-quantize llama-batched-bench llama-server]
#   LLM_SHAPE [llama-3.1-8b]  LLM_MODEL_DIR [/tmp/stoke_synth_$LLM_SHAPE] (as llm_bench.sh)  LLM_LAYERS [] (synth --layers)
#   LLAMA_GGUF_DIR [/tmp/stoke_gguf]  LLAMA_QUANTS [q8_0] (llama-quantize types made by convert besides bf16; empty: none)
#   LLAMA_NGL [99]  LLAMA_THREADS [] (-t for the benches; empty: llama.cpp's default)
#   LLAMA_BENCH_P [512] (prefill tokens, pp)  LLAMA_BENCH_N [128] (decoded tokens at batch 1, tg)  LLAMA_BENCH_R [5] (repetitions)
#   LLAMA_BATCHED_NPP [1000] (prompt tokens per sequence)  LLAMA_BATCHED_NTG [32] (generated per sequence)
#   LLAMA_BATCHED_NPL [64,256] (parallel sequences)  LLAMA_BATCHED_CTX [max(npl) * roundup(npp+ntg, 256)]
#   LLAMA_BATCHED_B [2048] (-b)  LLAMA_BATCHED_UB [512] (-ub)  SKIP_LLAMA_BENCH=1  SKIP_BATCHED=1
#   LLAMA_FIT [off] (-fit for batched-bench and server: off keeps -c and -ngl exactly as given)
#   LLAMA_SERVER_PORT [8090]  LLAMA_SERVER_NP [256] (-np)  LLAMA_SERVER_CTX_PER_SLOT [2048] (-c = NP * this)
#   LLAMA_SERVER_CONCURRENCY ["64 256"]  LLM_INPUT [1000]  LLM_OUTPUT [1000]  LLM_WARMUP_S [15]  LLM_DURATION_S [45]
# Flash attention is on everywhere (llama-bench -fa 1, the others -fa on), all layers on the GPU (-ngl 99).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
BUNDLE=${BUNDLE:-.bundle}
STOKE=${STOKE_BIN:-$BUNDLE/bin/stoke}
if [[ -d /usr/local/cuda/lib64 ]]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
[[ -d /usr/local/cuda/bin ]] && export PATH=$PATH:/usr/local/cuda/bin
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
[[ -z "${PYTHON:-}" && -x .venv/bin/python ]] && PY=.venv/bin/python

LCPP_DIR=${LLAMA_CPP_DIR:-/tmp/llama.cpp-peer}
SRC=$LCPP_DIR/llama.cpp
BUILD=$LCPP_DIR/build
BIN=$BUILD/bin
CUDA=${LLAMA_CPP_CUDA:-1}
TARGETS=${LLAMA_CPP_TARGETS:-"llama-bench llama-quantize llama-batched-bench llama-server"}
JOBS=${LLAMA_CPP_JOBS:-$(nproc)}
BUILD_LOG=$OUT/llama_cpp_build.log
BUILD_PID=$LCPP_DIR/build.pid
BUILD_RC=$LCPP_DIR/build.rc
SHAPE=${LLM_SHAPE:-llama-3.1-8b}
MODEL=${LLM_MODEL_DIR:-/tmp/stoke_synth_$SHAPE}
GGUF_DIR=${LLAMA_GGUF_DIR:-/tmp/stoke_gguf}
NGL=${LLAMA_NGL:-99}
FIT=${LLAMA_FIT:-off}
THREADS_ARG=()
[[ -n "${LLAMA_THREADS:-}" ]] && THREADS_ARG=(-t "$LLAMA_THREADS")
T0=$(date +%s)
stamp() { echo "=== [llama.cpp $(( $(date +%s) - T0 )) s] $*" >&2; }
die() { echo "llama_cpp.sh: $*" >&2; exit 1; }

tarball() {
  local t
  for t in "${LLAMA_CPP_TARBALL:-}" peers/llama.cpp.tar.xz "$BUNDLE/peers/llama.cpp.tar.xz"; do
    [[ -n "$t" && -f "$t" ]] && { echo "$t"; return 0; }
  done
  if [[ -f "$BUNDLE.tar.gz" ]] && tar -tzf "$BUNDLE.tar.gz" "$BUNDLE/peers/llama.cpp.tar.xz" >/dev/null 2>&1; then
    tar -xzf "$BUNDLE.tar.gz" "$BUNDLE/peers/llama.cpp.tar.xz" && { echo "$BUNDLE/peers/llama.cpp.tar.xz"; return 0; }
  fi
  return 1
}

# Unpack (when the tarball's version differs from what is unpacked) and configure.
do_configure() {
  command -v cmake >/dev/null || die "cmake not found"
  [[ "$CUDA" != 1 ]] || command -v nvcc >/dev/null || die "nvcc not found (not in PATH nor /usr/local/cuda/bin)"
  local tb
  tb=$(tarball) || die "no peers/llama.cpp.tar.xz (nor $BUNDLE/peers/): run bench/gpu/llama_cpp_pack.sh, then scripts/bundle.sh"
  mkdir -p "$LCPP_DIR"
  local want have=""
  want=$(tar -xJOf "$tb" llama.cpp/STOKE_PEER_VERSION | head -1)
  [[ -f "$SRC/STOKE_PEER_VERSION" ]] && have=$(head -1 "$SRC/STOKE_PEER_VERSION")
  if [[ "$want" != "$have" ]]; then
    stamp "unpack $tb ($want) -> $SRC"
    rm -rf "$SRC" "$BUILD"
    tar -xJf "$tb" -C "$LCPP_DIR" || die "unpacking $tb failed"
  fi
  local args=(-S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON)
  if [[ "$CUDA" == 1 ]]; then
    args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${LLAMA_CPP_CUDA_ARCH:-90}")
  else
    args+=(-DGGML_CUDA=OFF)
  fi
  command -v ninja >/dev/null && [[ ! -f "$BUILD/CMakeCache.txt" ]] && args+=(-G Ninja)
  command -v ccache >/dev/null && args+=(-DGGML_CCACHE=ON)
  # shellcheck disable=SC2206  # extra flags are a word list
  args+=(${LLAMA_CPP_CMAKE_ARGS:-})
  stamp "configure: cmake ${args[*]}"
  echo "cmake ${args[*]}" > "$LCPP_DIR/configure_command.txt"
  cmake "${args[@]}" || die "configure failed"
}

# The build itself (foreground); build-start runs it with nohup.
do_build() {
  do_configure
  stamp "build: cmake --build $BUILD -j$JOBS --target $TARGETS"
  # shellcheck disable=SC2086  # TARGETS is a word list
  cmake --build "$BUILD" -j"$JOBS" --target $TARGETS || die "build failed"
  local t
  for t in $TARGETS; do [[ -x "$BIN/$t" ]] || die "$BIN/$t missing after the build"; done
  stamp "built: $TARGETS"
}

build_start() {
  mkdir -p "$LCPP_DIR"
  if [[ -f "$BUILD_PID" ]] && kill -0 "$(cat "$BUILD_PID")" 2>/dev/null; then
    echo "llama_cpp.sh: a build is running already (pid $(cat "$BUILD_PID"), log $BUILD_LOG)" >&2; return 0
  fi
  rm -f "$BUILD_RC"
  # The child runs this script's `build` mode; the exit status lands in $BUILD_RC for build-wait.
  # shellcheck disable=SC2016  # expanded by the child shell
  nohup bash -c '"$0" build > "$1" 2>&1; echo $? > "$2"' "$ROOT/bench/gpu/llama_cpp.sh" "$BUILD_LOG" "$BUILD_RC" \
    >/dev/null 2>&1 &
  echo $! > "$BUILD_PID"
  stamp "build started in the background (pid $!, log $BUILD_LOG)"
}

build_wait() {
  local t
  if [[ ! -f "$BUILD_PID" && ! -f "$BUILD_RC" ]]; then
    for t in $TARGETS; do [[ -x "$BIN/$t" ]] || die "no build started (build-start) and $BIN/$t missing"; done
    return 0
  fi
  stamp "waiting for the llama.cpp build (log $BUILD_LOG)"
  while [[ ! -f "$BUILD_RC" ]]; do
    if [[ -f "$BUILD_PID" ]] && ! kill -0 "$(cat "$BUILD_PID")" 2>/dev/null && [[ ! -f "$BUILD_RC" ]]; then
      sleep 1; [[ -f "$BUILD_RC" ]] || die "the build process vanished without a status; see $BUILD_LOG"
    fi
    sleep 2
  done
  local rc
  rc=$(cat "$BUILD_RC")
  if [[ "$rc" != 0 ]]; then tail -40 "$BUILD_LOG" >&2; die "the build failed (exit $rc); log $BUILD_LOG"; fi
  stamp "llama.cpp build done: $(grep -o 'built: .*' "$BUILD_LOG" | tail -1)"
}

# A tool is used once it exists and no build (build-start) is still running, which may be replacing it.
need_bin() {
  if [[ ! -x "$BIN/$1" ]] || { [[ -f "$BUILD_PID" && ! -f "$BUILD_RC" ]] && kill -0 "$(cat "$BUILD_PID")" 2>/dev/null; }; then
    build_wait
  fi
  [[ -x "$BIN/$1" ]] || die "$BIN/$1 missing"
}

convert() {
  local synth=${1:-$MODEL} name bf16
  [[ -f "$synth/config.json" ]] || die "$synth/config.json missing (stoke model synth --shape $SHAPE --out $synth)"
  name=$(basename "$synth")
  mkdir -p "$GGUF_DIR"
  # No gguf package here: use the gguf-py (0.19.0, as tests/requirements.txt pins) that the tarball carries.
  if ! "$PY" -c "import gguf" 2>/dev/null; then
    local tb
    tb=$(tarball) || die "no gguf Python package and no llama.cpp tarball to take gguf-py from"
    mkdir -p "$LCPP_DIR/gguf-py"
    [[ -d "$LCPP_DIR/gguf-py/llama.cpp/gguf-py" ]] || tar -xJf "$tb" -C "$LCPP_DIR/gguf-py" llama.cpp/gguf-py ||
      die "extracting gguf-py from $tb failed"
    export GGUF_PY=$LCPP_DIR/gguf-py/llama.cpp/gguf-py
  fi
  bf16=$GGUF_DIR/$name-bf16.gguf
  if [[ -f "$bf16" && "$bf16" -nt "$synth/config.json" ]]; then
    stamp "reusing $bf16"
  else
    stamp "gguf_from_hf.py $synth -> $bf16"
    "$PY" bench/gpu/gguf_from_hf.py "$synth" "$bf16" || die "gguf_from_hf.py failed"
  fi
  local q out
  for q in ${LLAMA_QUANTS-q8_0}; do
    out=$GGUF_DIR/$name-$q.gguf
    if [[ -f "$out" && "$out" -nt "$bf16" ]]; then stamp "reusing $out"; continue; fi
    need_bin llama-quantize
    stamp "llama-quantize $bf16 -> $out ($q)"
    "$BIN/llama-quantize" "$bf16" "$out.tmp" "${q^^}" > "$OUT/llama_cpp_quantize_$name-$q.log" 2>&1 ||
      { tail -20 "$OUT/llama_cpp_quantize_$name-$q.log" >&2; die "llama-quantize $q failed"; }
    mv "$out.tmp" "$out"
  done
  ls -la "$GGUF_DIR"/"$name"-*.gguf >&2
}

bench() {
  local gguf=${1:?bench GGUF [TAG]} tag=${2:-}
  [[ -f "$gguf" ]] || die "$gguf missing"
  [[ -n "$tag" ]] || { tag=$(basename "$gguf" .gguf); }
  local dir=$OUT/llama_cpp_$tag
  mkdir -p "$dir"
  : > "$dir/commands.txt"
  local p=${LLAMA_BENCH_P:-512} n=${LLAMA_BENCH_N:-128} r=${LLAMA_BENCH_R:-5}
  if [[ -z "${SKIP_LLAMA_BENCH:-}" ]]; then
    need_bin llama-bench
    local cmd=("$BIN/llama-bench" -m "$gguf" -p "$p" -n "$n" -r "$r" -fa 1 -ngl "$NGL" "${THREADS_ARG[@]}" -o json)
    echo "${cmd[*]}" >> "$dir/commands.txt"
    stamp "llama-bench pp$p tg$n ($tag)"
    "${cmd[@]}" > "$dir/llama_bench.json" 2> "$dir/llama_bench.log" ||
      { tail -20 "$dir/llama_bench.log" >&2; echo "llama-bench failed" >&2; }
  fi
  if [[ -z "${SKIP_BATCHED:-}" ]]; then
    need_bin llama-batched-bench
    local npp=${LLAMA_BATCHED_NPP:-1000} ntg=${LLAMA_BATCHED_NTG:-32} npl=${LLAMA_BATCHED_NPL:-64,256}
    local maxpl=0 x
    for x in ${npl//,/ }; do (( x > maxpl )) && maxpl=$x; done
    # Without a unified KV cache every sequence gets n_ctx / n_seq_max cells: room for npp + ntg each.
    local ctx=${LLAMA_BATCHED_CTX:-$(( maxpl * ( (npp + ntg + 255) / 256 * 256 ) ))}
    local cmd=("$BIN/llama-batched-bench" -m "$gguf" -c "$ctx" -b "${LLAMA_BATCHED_B:-2048}"
      -ub "${LLAMA_BATCHED_UB:-512}" -npp "$npp" -ntg "$ntg" -npl "$npl" -fa on -ngl "$NGL" -fit "$FIT"
      "${THREADS_ARG[@]}" --output-format jsonl)
    echo "${cmd[*]}" >> "$dir/commands.txt"
    stamp "llama-batched-bench npp $npp ntg $ntg npl $npl c $ctx ($tag)"
    "${cmd[@]}" > "$dir/batched_bench.out" 2> "$dir/batched_bench.log" ||
      { tail -20 "$dir/batched_bench.log" >&2; echo "llama-batched-bench failed" >&2; }
    # The jsonl rows go to the log stream (LOG), stdout or stderr depending on the version: take them from both.
    grep -h '^{"n_kv_max"' "$dir/batched_bench.out" "$dir/batched_bench.log" > "$dir/batched_bench.jsonl" || true
  fi
  "$PY" - "$dir" "$gguf" "$tag" <<'PY'
import json, pathlib, sys
d, gguf, tag = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
s = {"engine": "llama.cpp", "tag": tag, "gguf": gguf,
     "commands": [l for l in (d / "commands.txt").read_text().splitlines() if l]}
try:
    v = (pathlib.Path(__import__("os").environ.get("LLAMA_CPP_DIR", "/tmp/llama.cpp-peer")) / "llama.cpp/STOKE_PEER_VERSION")
    s["llama_cpp_source"] = v.read_text().splitlines()[0]
except OSError:
    pass
lb = d / "llama_bench.json"
if lb.exists():
    try:
        rows = json.loads(lb.read_text() or "[]")
        s["llama_bench"] = [{
            "test": ("pp%d" % r["n_prompt"]) if r.get("n_gen", 0) == 0 else ("tg%d" % r["n_gen"]) if r.get("n_prompt", 0) == 0
                    else "pp%d+tg%d" % (r["n_prompt"], r["n_gen"]),
            "n_prompt": r.get("n_prompt"), "n_gen": r.get("n_gen"), "n_batch": r.get("n_batch"), "n_ubatch": r.get("n_ubatch"),
            "tokens_per_s": r.get("avg_ts"), "tokens_per_s_stddev": r.get("stddev_ts"),
            "ms_per_token": (1000.0 / r["avg_ts"]) if r.get("avg_ts") else None, "repetitions": len(r.get("samples_ts") or []),
            "flash_attn": r.get("flash_attn"), "n_gpu_layers": r.get("n_gpu_layers"), "type_k": r.get("type_k"),
            "model_type": r.get("model_type"), "model_size": r.get("model_size"), "gpu_info": r.get("gpu_info"),
            "backends": r.get("backends"), "build_commit": r.get("build_commit"), "build_number": r.get("build_number"),
        } for r in rows]
    except (ValueError, KeyError) as e:
        s["llama_bench_error"] = f"{lb.name}: {e}"
bb = d / "batched_bench.jsonl"
if bb.exists():
    rows = [json.loads(l) for l in bb.read_text().splitlines() if l.strip()]
    s["batched_bench"] = [{
        "parallel": r["pl"], "prompt_tokens_per_seq": r["pp"], "gen_tokens_per_seq": r["tg"], "n_kv_max": r["n_kv_max"],
        "prefill_s": r["t_pp"], "prefill_tokens_per_s": r["speed_pp"],
        "decode_s": r["t_tg"], "decode_tokens_per_s": r["speed_tg"],
        "decode_ms_per_step": 1000.0 * r["t_tg"] / r["tg"] if r["tg"] else None,
        "total_s": r["t"], "total_tokens_per_s": r["speed"], "n_batch": r["n_batch"], "n_ubatch": r["n_ubatch"],
        "flash_attn": r["flash_attn"], "n_gpu_layers": r["n_gpu_layers"]} for r in rows]
    if not rows:
        s["batched_bench_error"] = "no jsonl rows; see batched_bench.log"
(d / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
for r in s.get("llama_bench", []):
    print(f"{tag} llama-bench {r['test']}: {r['tokens_per_s']:.1f} tok/s", file=sys.stderr)
for r in s.get("batched_bench", []):
    print(f"{tag} batched-bench pl={r['parallel']}: prefill {r['prefill_tokens_per_s']:.0f} tok/s, "
          f"decode {r['decode_tokens_per_s']:.0f} tok/s ({r['decode_ms_per_step']:.1f} ms/step)", file=sys.stderr)
PY
  stamp "bench $tag -> $dir/summary.json"
}

SERVER_PID=$LCPP_DIR/server.pid
server() {
  local gguf=${1:?server GGUF}
  [[ -f "$gguf" ]] || die "$gguf missing"
  need_bin llama-server
  server_stop quiet
  local np=${LLAMA_SERVER_NP:-256} per=${LLAMA_SERVER_CTX_PER_SLOT:-2048} port=${LLAMA_SERVER_PORT:-8090}
  local cmd=("$BIN/llama-server" -m "$gguf" --host 127.0.0.1 --port "$port" -np "$np" -c $(( np * per ))
    -fa on -ngl "$NGL" --cont-batching -fit "$FIT" --no-webui --metrics "${THREADS_ARG[@]}")
  local log=$OUT/llama_cpp_server.log
  echo "${cmd[*]}" > "$OUT/llama_cpp_server_command.txt"
  stamp "llama-server: ${cmd[*]}"
  "${cmd[@]}" > "$log" 2>&1 &
  echo $! > "$SERVER_PID"
  local url=http://127.0.0.1:$port
  "$PY" - "$url" "$(cat "$SERVER_PID")" <<'PY' || { tail -30 "$log" >&2; die "llama-server did not become ready (log $log)"; }
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
for _ in range(1200):
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(1)
PY
  stamp "llama-server ready at $url (pid $(cat "$SERVER_PID"), log $log)"
  echo "$url"
}

server_stop() {
  if [[ -f "$SERVER_PID" ]]; then
    local pid
    pid=$(cat "$SERVER_PID")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"; for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
      [[ "${1:-}" == quiet ]] || stamp "llama-server (pid $pid) stopped"
    fi
    rm -f "$SERVER_PID"
  fi
}

# llama-server under the same load stoke serve gets in llm_bench.sh (closed loop, openai-completions, fixed lengths).
server_bench() {
  local gguf=${1:?server-bench GGUF [TAG]} tag=${2:-}
  [[ -n "$tag" ]] || tag=$(basename "$gguf" .gguf)
  local url c
  url=$(server "$gguf") || return 1
  for c in ${LLAMA_SERVER_CONCURRENCY:-64 256}; do
    local dir=$OUT/llama_cpp_serve_${tag}_c$c
    stamp "stoke bench against llama-server: concurrency $c, ${LLM_INPUT:-1000} in / ${LLM_OUTPUT:-1000} out"
    # The limit follows the window (a fixed 300 s once cut a 289 s window before its JSON was written).
    timeout $(( ${LLM_WARMUP_S:-15} + ${LLM_DURATION_S:-45} + ${LLM_DRAIN_S:-5} + 240 )) \
      "$STOKE" bench --url "$url" --api openai-completions --concurrency "$c" --temperature 0 \
      --input-len "${LLM_INPUT:-1000}" --output-len "${LLM_OUTPUT:-1000}" --warmup "${LLM_WARMUP_S:-15}" \
      --duration "${LLM_DURATION_S:-45}" --window 5 --stability 0 --drain-timeout "${LLM_DRAIN_S:-5}" --timeout 600 \
      --label "$tag, llama.cpp server, c=$c" --output-dir "$dir" >/dev/null || echo "stoke bench c=$c failed: exit $?" >&2
    "$PY" -c "import json,sys; p=json.load(open(sys.argv[1]))['points'][0]; print('llama.cpp c=%s: %.0f output tok/s, TTFT p50 %.0f ms, TPOT p50 %.1f ms' % (sys.argv[2], p['throughput']['output_tokens_per_s'], p['ttft_ms']['p50'], p['tpot_ms']['p50']))" "$dir/bench.json" "$c" >&2 || true
  done
  server_stop
}

all() {
  build_start
  if [[ -f "$MODEL/config.json" ]] && grep -q "\"shape\": \"$SHAPE\"" "$MODEL/config.json"; then
    stamp "reusing $MODEL"
  else
    local layers=()
    [[ -n "${LLM_LAYERS:-}" ]] && layers=(--layers "$LLM_LAYERS")
    stamp "synth $SHAPE -> $MODEL"
    "$STOKE" model synth --shape "$SHAPE" --seed 1 --out "$MODEL" "${layers[@]}" || die "synth failed"
  fi
  convert "$MODEL"
  local name q
  name=$(basename "$MODEL")
  local tags=("${SHAPE}_bf16")
  bench "$GGUF_DIR/$name-bf16.gguf" "${SHAPE}_bf16"
  for q in ${LLAMA_QUANTS-q8_0}; do bench "$GGUF_DIR/$name-$q.gguf" "${SHAPE}_$q"; tags+=("${SHAPE}_$q"); done
  # $OUT/llama_cpp_summary.json: every summary.json of this run, by tag.
  "$PY" - "$OUT" "${tags[@]}" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
s = {}
for tag in sys.argv[2:]:
    try:
        s[tag] = json.loads((out / f"llama_cpp_{tag}" / "summary.json").read_text())
    except (OSError, ValueError) as e:
        s[tag] = {"error": str(e)}
(out / "llama_cpp_summary.json").write_text(json.dumps(s, indent=2) + "\n")
PY
  stamp "done: $OUT/llama_cpp_summary.json"
}

# One compound command, parsed whole before it runs, with the exit inside it: editing this file while a
# background build (build-start) runs it cannot make bash read on into the new text.
{
mode=${1:-}
shift || true
case "$mode" in
  configure) do_configure ;;
  build) do_build ;;
  build-start) build_start ;;
  build-wait) build_wait ;;
  convert) convert "$@" ;;
  bench) bench "$@" ;;
  server) server "$@" ;;
  server-stop) server_stop ;;
  server-bench) server_bench "$@" ;;
  all) all 2>&1 | tee "$OUT/llama_cpp.log" ;;
  *) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
exit $?
}
