#!/usr/bin/env bash
# Issue 12 on the GPU machine: `stoke doctor` against scenarios whose bottleneck is known, with the H200's real
# NVML/GPM counters (no fake), and timelines (`stoke trace`) of the 8B decoder under load and of the
# small-kernels case. From the repo root with .bundle/ (scripts/bundle.sh) carried along.
#   scenario           server                                                     expected
#   small_kernels      examples/synthetic/small_kernels.json (200 one-block kernels)  launch_bound
#   cpu_preprocess     examples/synthetic/cpu_preprocess.json (2 ms CPU per item)     host_bound
#   bandwidth          examples/synthetic/bandwidth.json (2 instances streaming HBM)  bandwidth_bound
#   copy_bound         examples/synthetic/copy_bound.json (32 MiB pageable H2D/row)   copy_bound
#   tensor_bound       examples/synthetic/tensor_bound.json (wmma on the tensor cores) compute_bound
#   long_delay         examples/synthetic/long_delay.json (30 ms batching delay)      queue_bound
#   sparse             tensor_bound.json, one client every 100 ms, --load none        under_fed
#   llm_8b_c1          Llama-3.1-8B shape (stoke model synth), 1 client              bandwidth_bound
#   llm_8b_c64         the same, 64 clients                                           throttled (at its 700 W cap)
#   llm_8b_kv_full     the same with --kv-blocks 64 (1,024 tokens of KV), 16 clients kv_capacity_bound
# The doctor takes its own short trace inside each window (--trace auto): signals.trace in each row (kernels per
# request, mean kernel us, gaps between GPU records).
# DOCTOR_SCENARIOS picks a subset (default: "small_kernels cpu_preprocess bandwidth copy_bound tensor_bound
# long_delay sparse llm_8b llm_8b_kv").
# Outputs in $OUT: doctor_gpu_summary.json (scenario -> verdicts -> evidence), doctor_gpu.tar.gz (every doctor
# JSON/text, server log and trace), log.txt. Budget: about 10 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
WORK=$OUT/doctor_gpu
mkdir -p "$WORK"
BUNDLE=${BUNDLE:-.bundle}
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
STOKE=${STOKE_BIN:-$BUNDLE/bin/stoke}
[[ -d /usr/local/cuda/lib64 ]] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
GEMM_CACHE=${GEMM_CACHE:-$OUT/gemm_cache.json}  # stoke serve --gemm-cache for the decoder
export PYTHONUNBUFFERED=1
PORT=18000
MODEL_8B=${LLM_MODEL_DIR:-/tmp/stoke_synth_llama-3.1-8b}
SCENARIOS=" ${DOCTOR_SCENARIOS:-small_kernels cpu_preprocess bandwidth copy_bound tensor_bound long_delay sparse llm_8b llm_8b_kv} "
want() { [[ $SCENARIOS == *" $1 "* ]]; }
T0=$(date +%s)
stamp() { echo "=== [$(($(date +%s) - T0)) s] $*"; }

SERVER_PID=
start_server() {  # NAME ARGS...: stoke serve on $PORT, waits for /health/ready
  local name=$1; shift
  "$STOKE" serve --port "$PORT" "$@" > "$WORK/serve_$name.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health/ready" >/dev/null 2>&1 && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "server $name exited"; tail -5 "$WORK/serve_$name.log"; return 1; }
    sleep 0.5
  done
  echo "server $name not ready in 300 s"; return 1
}
stop_server() {
  [[ -n "$SERVER_PID" ]] || return 0
  kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=
}
doctor() {  # NAME DOCTOR-ARGS...
  local name=$1; shift
  stamp "doctor $name"
  timeout 240 "$STOKE" doctor --url "http://127.0.0.1:$PORT" --quiet --json "$WORK/doctor_$name.json" \
    --html "$WORK/doctor_$name.html" "$@" > "$WORK/doctor_$name.txt" 2>&1 || echo "doctor $name: exit $?"
  head -20 "$WORK/doctor_$name.txt"
}
trace_under_load() {  # NAME BENCH-ARGS...: a 3 s trace while stoke bench drives the server
  local name=$1; shift
  stamp "trace $name"
  timeout 120 "$STOKE" bench --url "http://127.0.0.1:$PORT" "$@" --output-dir "$WORK/bench_$name" \
    > "$WORK/bench_$name.log" 2>&1 &
  local bench=$!
  sleep 4
  timeout 60 "$STOKE" trace --url "http://127.0.0.1:$PORT" --seconds 3 -o "$WORK/trace_$name.json" \
    > "$WORK/trace_$name.txt" 2>&1 || echo "trace $name: exit $?"
  cat "$WORK/trace_$name.txt"
  wait "$bench"
}

pack() {  # the summary and the tarball so far (called after each scenario: a cut-off run still returns them)
  python3 - "$WORK" "$OUT/doctor_gpu_summary.json" <<'EOF'
import json, pathlib, sys
work, out = pathlib.Path(sys.argv[1]), sys.argv[2]
expected = {"small_kernels": "launch_bound", "cpu_preprocess": "host_bound", "bandwidth": "bandwidth_bound",
            "copy_bound": "copy_bound", "tensor_bound": "compute_bound", "long_delay": "queue_bound",
            "sparse": "under_fed",
            "llm_8b_c1": "bandwidth_bound", "llm_8b_c64": "throttled", "llm_8b_kv_full": "kv_capacity_bound"}
rows = []
for name, want in expected.items():
    p = work / f"doctor_{name}.json"
    if not p.exists():
        rows.append({"scenario": name, "expected": want, "verdicts": None, "correct": False, "error": "no JSON"})
        continue
    d = json.loads(p.read_text())
    v = [x["bottleneck"] for x in d.get("verdicts", [])]
    rows.append({"scenario": name, "expected": want, "verdicts": v,
                 "correct": (want in v[:1]) if want else None,
                 "evidence": [{k: e.get(k) for k in ("signal", "value", "op", "threshold")}
                              for x in d.get("verdicts", [])[:2] for e in x.get("evidence", [])],
                 "next_step": [x.get("next_step") for x in d.get("verdicts", [])[:2]],
                 "signals": {k: d.get("signals", {}).get(k) for k in
                             ("gpu_util", "sm_active", "dram_active", "tensor_active", "instance_busy",
                              "stage_s", "kv_usage_max", "preemptions", "requests", "power_w", "power_violation_share",
                              "clock_reason_share", "trace")}})
traces = {}
for t in work.glob("trace_*.txt"):
    traces[t.stem] = t.read_text()[-2000:]
json.dump({"rows": rows, "traces": traces}, open(out, "w"), indent=1)
for r in rows:
    print(f"{r['scenario']:16s} expected {str(r['expected']):18s} got {r['verdicts']}")
EOF
  tar -C "$OUT" -czf "$OUT/doctor_gpu.tar.gz" doctor_gpu
  if (($(stat -c %s "$OUT/doctor_gpu.tar.gz") > 15 * 1024 * 1024)); then  # what comes back: 16 MiB a file
    tar -C "$OUT" -czf "$OUT/doctor_gpu.tar.gz" --exclude='trace_*.json' --exclude='bench_*' doctor_gpu
    for t in "$WORK"/trace_*.json; do xz -T4 -c "$t" > "$OUT/$(basename "$t").xz"; done
  fi
}

main() {
  nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv
  for s in small_kernels cpu_preprocess bandwidth copy_bound tensor_bound long_delay; do
    want "$s" || continue
    stamp "scenario $s"
    start_server "$s" --model "examples/synthetic/$s.json" --device cuda || continue
    # 1 MiB inputs per request: sent as binary tensors, or JSON parsing is what the doctor (rightly) finds.
    local binary=(); [[ $s == bandwidth ]] && binary=(--kserve-binary)
    doctor "$s" --concurrency 1,8,32 --duration 12 "${binary[@]}"
    [[ $s == small_kernels ]] && trace_under_load "$s" --api kserve-http --model "$s" --concurrency 8 \
      --duration 8 --warmup 1
    stop_server
    pack
  done
  if want sparse && start_server sparse --model examples/synthetic/tensor_bound.json --device cuda; then
    # One client, one request every 100 ms: the server waits for work.
    python3 - "$PORT" > "$WORK/sparse_client.log" 2>&1 <<'PY' &
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/v2/models/tensor_bound/infer"
body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [1, 4096],
                               "data": [7] * 4096}]}).encode()
for _ in range(600):
    urllib.request.urlopen(urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}),
                           timeout=30).read()
    time.sleep(0.1)
PY
    local client=$!
    sleep 1
    doctor sparse --load none --duration 8
    kill "$client" 2>/dev/null; wait "$client" 2>/dev/null
    stop_server
    pack
  fi

  want llm_8b || want llm_8b_kv || { pack; return; }
  stamp "synth llama-3.1-8b -> $MODEL_8B"
  [[ -f "$MODEL_8B/config.json" ]] || timeout 300 "$STOKE" model synth --shape llama-3.1-8b --seed 1 \
    --out "$MODEL_8B" > "$WORK/synth.log" 2>&1 || echo "synth failed"
  if want llm_8b && start_server llm_8b --model "$MODEL_8B" --device cuda --gemm-cache "$GEMM_CACHE"; then
    doctor llm_8b_c1 --concurrency 1 --duration 15 --input-len 128 --output-len 128
    doctor llm_8b_c64 --concurrency 64 --duration 25 --input-len 512 --output-len 256
    trace_under_load llm_8b --api openai-completions --concurrency 16 --input-len 256 --output-len 128 \
      --duration 8 --warmup 2
    stop_server
    pack
  fi
  if want llm_8b_kv && start_server llm_8b_kv --model "$MODEL_8B" --device cuda --kv-blocks 64 --block-size 16; then
    doctor llm_8b_kv_full --concurrency 16 --duration 20 --input-len 256 --output-len 256
    stop_server
  fi
  pack

  stamp "done"
}
main 2>&1 | tee "$OUT/log.txt"
