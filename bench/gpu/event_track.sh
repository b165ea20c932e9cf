#!/usr/bin/env bash
# Issue 12 on the GPU machine: the timeline's GPU track where CUPTI is missing. Serves a random Llama-3.2-1B
# shape (stoke model synth) on CUDA with CUPTI made unloadable (STOKE_CUPTI_LIBRARY=/nonexistent), drives it
# with stoke bench, records a 3 s trace and checks the engine's "gpu step" spans (CUDA events around each
# model step) are there; then `stoke doctor --trace on` reads GPU busy share and gaps from them.
# Outputs in $OUT: event_track.json (summary), trace_events.json.xz, doctor_events.json, log lines on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
BUNDLE=${BUNDLE:-.bundle}
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
STOKE=${STOKE_BIN:-$BUNDLE/bin/stoke}
[[ -d /usr/local/cuda/lib64 ]] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
MODEL=/tmp/stoke_synth_llama-3.2-1b
PORT=18100
[[ -f $MODEL/config.json ]] || timeout 240 "$STOKE" model synth --shape llama-3.2-1b --seed 1 --out "$MODEL" >/dev/null
STOKE_CUPTI_LIBRARY=/nonexistent/libcupti.so "$STOKE" serve --model "$MODEL" --device cuda --port $PORT \
  > "$OUT/event_track_serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health/ready" >/dev/null 2>&1 && break; sleep 0.5; done
timeout 60 "$STOKE" bench --url "http://127.0.0.1:$PORT" --api openai-completions --concurrency 8 \
  --input-len 256 --output-len 64 --duration 10 --warmup 1 --output-dir "$OUT/event_bench" > "$OUT/event_bench.log" 2>&1 &
BENCH=$!
sleep 3
timeout 30 "$STOKE" trace --url "http://127.0.0.1:$PORT" --seconds 3 -o "$OUT/trace_events.json" > "$OUT/trace_events.txt" 2>&1
cat "$OUT/trace_events.txt"
wait $BENCH
timeout 120 "$STOKE" doctor --url "http://127.0.0.1:$PORT" --concurrency 8 --duration 6 --trace on --quiet \
  --json "$OUT/doctor_events.json" > "$OUT/doctor_events.txt" 2>&1
head -15 "$OUT/doctor_events.txt"
kill -TERM $SERVER; wait $SERVER
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
t = json.loads((out / "trace_events.json").read_text())
threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in t["traceEvents"]
           if e.get("ph") == "M" and e.get("name") == "thread_name"}
gpu = [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("name") == "gpu step"
       and threads.get((e["pid"], e["tid"])) == "gpu (cuda events)"]
steps = [e for e in t["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("step (")]
d = json.loads((out / "doctor_events.json").read_text()) if (out / "doctor_events.json").exists() else {}
tr = d.get("signals", {}).get("trace", {})
summary = {"kernel_track": t.get("otherData", {}).get("kernel_track"), "engine_steps": len(steps),
           "gpu_step_spans": len(gpu), "gpu_step_mean_us": sum(e["dur"] for e in gpu) / max(1, len(gpu)),
           "doctor_trace": tr, "doctor_verdicts": [v["bottleneck"] for v in d.get("verdicts", [])]}
json.dump(summary, open(out / "event_track.json", "w"), indent=1)
print(json.dumps(summary, indent=1)[:3000])
PY
xz -T4 -f "$OUT/trace_events.json"
