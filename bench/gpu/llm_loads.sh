#!/usr/bin/env bash
# Issue 16's load shapes on the GPU machine, from the repo root with the bundle (scripts/bundle.sh): one
# `stoke serve --device cuda` of the Llama-3.1-8B shape (random weights, stoke model synth), then closed-loop
# `stoke bench` runs of each load in LOADS, with the server's /metrics read before and after each one:
#   short    128 in / 128 out at concurrency 256
#   long     4,000 in / 500 out at concurrency 64
#   shared   a 1,000-token system prompt shared by every request + 200 own tokens, 200 out, concurrency 256
#            (prefix-cache hit rate = prefix_cache_hits / prefix_cache_queries over the run)
# Each load: output tok/s, TTFT / TPOT p50 and p99 (stoke bench's bench.json), and from /metrics the deltas of
# preemptions, prefix-cache hits and queries, prompt and generated tokens and the KV-cache use at the end; and
# `stoke doctor --load none` watching the measured window (as llm_bench.sh does): its verdict and the per-step split
# (steps, model / host ms per step, tokens, modelled weight and KV bytes, matmul FLOPs; with LOADS_DOCTOR_RATES,
# e.g. "--hbm-gbps 4200 --tensor-tflops 700", the time each part takes at those rates) in
# $OUT/llm_loads/<load>.doctor.{json,txt}.
# Output: $OUT/llm_loads_summary.json (+ $OUT/llm_loads/<load>/bench.json, the server log).
# Knobs (env): LOADS ("short long shared"), LOADS_SERVE_ARGS (more serve flags), LOADS_WARMUP_S (10),
# LOADS_DURATION_S (30), LLM_SHAPE, LLM_LAYERS; CPU dry run: LOADS_DEVICE=cpu LLM_SHAPE=smollm2-135m LLM_LAYERS=2
# LOADS_SCALE=0.05 (lengths and concurrencies scaled down) bench/gpu/llm_loads.sh build/release/apps/stoke
set -uo pipefail
BIN_ARG=${1:+$(realpath "$1")}
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=bench/gpu/common.sh
source bench/gpu/common.sh
bench_setup "$BIN_ARG"
mkdir -p "$OUT/llm_loads"
DEVICE=${LOADS_DEVICE:-cuda}
SCALE=${LOADS_SCALE:-1}
sc() { python3 -c "import sys; print(max(1, round($1 * $SCALE)))"; }

synth_model "$OUT/llm_loads/synth.log" || exit 1

LOG=$OUT/llm_loads/serve.log
# shellcheck disable=SC2086  # LOADS_SERVE_ARGS is a list of flags
"$STOKE" serve --model "$MODEL" --device "$DEVICE" --host 127.0.0.1 --port 0 --max-num-seqs "$(sc 256)" \
  --max-num-batched-tokens 8192 --max-waiting 4096 ${LOADS_SERVE_ARGS:-} 2> "$LOG" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null' EXIT
URL=$(serve_url "$LOG" $PID) || exit 1
stamp "server ready at $URL"

run_load() {  # run_load NAME CONCURRENCY IN OUT [SHARED_PREFIX]
  local name=$1 conc=$2 in=$3 out=$4 shared=${5:-0}
  stamp "load $name: concurrency $conc, $in in ($shared shared) / $out out"
  http_get "$URL/metrics" > "$OUT/llm_loads/$name.metrics_before" || true
  local warm=${LOADS_WARMUP_S:-10} dur=${LOADS_DURATION_S:-30}
  doctor_watch "$URL" "$warm" "$dur" "$OUT/llm_loads/$name.doctor" "${LOADS_DOCTOR_RATES:-}"
  local dpid=$DOCTOR_PID
  timeout 400 "$STOKE" bench --url "$URL" --api openai-completions --concurrency "$conc" --temperature 0 \
    --input-len "$in" --output-len "$out" --shared-prefix "$shared" --warmup "$warm" \
    --duration "$dur" --window 5 --stability 0 --drain-timeout 5 --timeout 600 \
    --label "$SHAPE synth, $name" --output-dir "$OUT/llm_loads/$name" >/dev/null ||
    echo "stoke bench $name failed: exit $?"
  http_get "$URL/metrics" > "$OUT/llm_loads/$name.metrics_after" || true
  wait "$dpid"
}
for load in ${LOADS:-short long shared}; do
  case $load in
    short) run_load short "$(sc 256)" "$(sc 128)" "$(sc 128)" ;;
    long) run_load long "$(sc 64)" "$(sc 4000)" "$(sc 500)" ;;
    shared) run_load shared "$(sc 256)" "$(sc 1200)" "$(sc 200)" "$(sc 1000)" ;;
    *) echo "unknown load $load" ;;
  esac
done

python3 - "$OUT" "${LOADS:-short long shared}" <<'EOF'
import json, os, re, sys
out, loads = sys.argv[1], sys.argv[2].split()
def metrics(path):
    vals = {}
    try:
        for line in open(path):
            m = re.match(r'^(stoke:[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$', line.strip())
            if m:
                vals[m[1]] = vals.get(m[1], 0.0) + float(m[3])
    except OSError:
        pass
    return vals
summary = {}
for name in loads:
    d = os.path.join(out, "llm_loads")
    row = {}
    try:
        p = json.load(open(os.path.join(d, name, "bench.json")))["points"][0]
        row = {"output_tokens_per_s": p["throughput"]["output_tokens_per_s"],
               "ttft_ms_p50": p["ttft_ms"]["p50"], "ttft_ms_p99": p["ttft_ms"]["p99"],
               "tpot_ms_p50": p["tpot_ms"]["p50"], "tpot_ms_p99": p["tpot_ms"]["p99"], "valid": p.get("valid")}
    except Exception as e:
        row["error"] = f"bench.json: {e}"
    a, b = metrics(os.path.join(d, name + ".metrics_after")), metrics(os.path.join(d, name + ".metrics_before"))
    delta = lambda k: a.get(k, 0.0) - b.get(k, 0.0)
    row["preemptions"] = delta("stoke:num_preemptions_total")
    row["prompt_tokens"] = delta("stoke:prompt_tokens_total")
    row["generation_tokens"] = delta("stoke:generation_tokens_total")
    q, h = delta("stoke:prefix_cache_queries_total"), delta("stoke:prefix_cache_hits_total")
    row["prefix_cache_hit_rate"] = h / q if q > 0 else None
    row["kv_cache_usage_ratio_at_end"] = a.get("stoke:kv_cache_usage_ratio")
    # The doctor's verdict and per-step split over the measured window (docs/doctor.md "step split").
    try:
        doc = json.load(open(os.path.join(d, name + ".doctor.json")))
        sig = doc.get("signals", {})
        row["doctor_verdict"] = (doc.get("verdicts") or [{}])[0].get("bottleneck")
        row["step_split"] = {k: v for k, v in sig.items() if v is not None and (k.startswith("step") or k in (
            "engine_busy", "hbm_gbps", "tensor_tflops", "kv_usage_mean", "kv_usage_max", "preemptions"))} or None
    except Exception as e:
        row["doctor_error"] = str(e)
    summary[name] = row
json.dump(summary, open(os.path.join(out, "llm_loads_summary.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
EOF
stamp "done"
