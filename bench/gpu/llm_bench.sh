#!/usr/bin/env bash
# LLM benchmark on the GPU machine, from the repo root with .bundle/ (scripts/bundle.sh) carried along:
#   1. stoke model synth --shape llama-3.1-8b (bf16, random weights: no download)
#   2. stoke bench step --device cuda: decode (batch 1, context 512; and batch 64, context 1024) and a
#      2048-token prefill against the device's measured D2D bandwidth and bf16 GEMM rate
#   3. stoke serve --device cuda + stoke bench --api openai-completions, closed loop at concurrency 64 and
#      256, 1000-token prompts, exactly 1000 output tokens (ignore_eos + min_tokens)
#   4. bench/gpu/hf_generate_bench.py: transformers generate at the same batch sizes and lengths (bf16)
#      with `stoke doctor --load none` watching each window: verdict, KV use, preemptions, per-step split
#      ($OUT/doctor_<shape>_c<c>.{json,txt}; timed at the device's rates from bench step's roofline probe)
#   5. $OUT/llm_bench_summary$LLM_TAG.json: output tokens/s, TTFT and TPOT p50/p99 of both, and stoke / HF ratios
# Everything lands in $OUT (default /tmp/stoke_gpu_out); progress on stderr, all of it in $OUT/llm_bench$LLM_TAG.log.
# Budget: about 7 minutes on an H200. Knobs (env): LLM_SHAPE, LLM_CONCURRENCY ("64 256"), LLM_INPUT (1000),
# LLM_OUTPUT (1000), LLM_SERVE_ARGS (more `stoke serve` flags, e.g. "--quantization fp8 --kv-cache-dtype fp8"),
# LLM_TAG (suffix of the serve_* output folders), LLM_TRACE_S (a timeline of that many seconds mid-window:
# GPU time by kernel per step in $OUT/trace_*.txt), SKIP_STEP=1 (no bench step; the doctor still gets the device's rates
# from a few-second roofline probe, $OUT/roofline_probe.json), LLM_WARMUP_S (15), LLM_RAMP_S (0:
# clients start over that much of the warm-up, stoke bench --ramp-up), LLM_DURATION_S (45; or one per concurrency, e.g. "45 60 70 150" for "64 256 512 1024": the window must hold
# whole requests, ~twice one request's time, or TTFT / TPOT are not measured), LLM_DRAIN_S (5), HF_BUDGET_S (60), SKIP_HF=1, SKIP_SERVE=1,
# STEP_AB=1 (decode step with one switch flipped at a time: cuBLASLt instead of the GEMV, PDL off (the default
# --pdl auto uses it in the batch-1 steps) or on at batch 64, GEMV
# warps per row, fp8 weights at batch 2 / 4 / 8 with and without the fp8 GEMV (b2_fp8_gemv, b8_fp8_gemv), its CUDA-core
# kernel past one row (_cc), PDL there (_pdl), decode-attention split size and load pipelining, the 2026-12-03 changes all off ("before"),
# no CUDA graphs, host sampling; batch 1, 8 and 64; mixed steps split or not at batch 64 / 256; or a list of variant names; STEP_AB_ROUNDS, STEP_AB_ITERS), SERVE_SAMPLING (device | host, passed to serve --sampling); for a
# CPU dry run of the script itself: LLM_DEVICE=cpu LLM_LAYERS=2 SKIP_STEP_B64=1 and small lengths.
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=bench/gpu/common.sh
source bench/gpu/common.sh
bench_setup
GEMM_CACHE=${GEMM_CACHE:-$OUT/gemm_cache.json}  # stoke --gemm-cache: tuned cuBLASLt algorithms kept across runs
export PYTHONUNBUFFERED=1
CONC=${LLM_CONCURRENCY:-"64 256"}
IN=${LLM_INPUT:-1000}
OUTLEN=${LLM_OUTPUT:-1000}
WARMUP=${LLM_WARMUP_S:-15}
read -r -a DURATIONS <<< "${LLM_DURATION_S:-45}"  # one for all, or one per concurrency (the last repeats)
HF_BUDGET=${HF_BUDGET_S:-60}
DEVICE=${LLM_DEVICE:-cuda}

main() {
  synth_model "$OUT/llm_synth.log" || return 1

  if [[ -z "${SKIP_STEP:-}" ]]; then
  stamp "bench step: decode batch 1 ctx 512, prefill 2048"
  timeout 240 "$STOKE" bench step --model "$MODEL" --device "$DEVICE" --gemm-cache "$GEMM_CACHE" --decode-batch 1 --context 512 --prefill 2048 \
    --iters 40 --json "$OUT/step_${SHAPE}_b1.json" >/dev/null || echo "bench step (b1) failed: exit $?"
  fi
  if [[ -z "${SKIP_STEP_B64:-}${SKIP_STEP:-}" ]]; then
    stamp "bench step: decode batch 64 ctx 1024 (no prefill)"
    timeout 180 "$STOKE" bench step --model "$MODEL" --device "$DEVICE" --gemm-cache "$GEMM_CACHE" --decode-batch 64 --context 1024 \
      --prefill 0 --iters 20 --json "$OUT/step_${SHAPE}_b64.json" >/dev/null || echo "bench step (b64) failed: exit $?"
  fi

  if [[ -n "${STEP_AB:-}" ]]; then
    # One switch off at a time, same model, same machine, same call: what each part of the decode path buys.
    local variants=(
      "b1_cublaslt|--gemv-max-rows 0|--decode-batch 1 --context 512"
      "b1_pdl|--pdl on|--decode-batch 1 --context 512"
      "b1_nopdl|--pdl off|--decode-batch 1 --context 512"
      "b1_default||--decode-batch 1 --context 512"
      "b1_fp8|--quantization fp8|--decode-batch 1 --context 512"
      "b1_fp8_pdl|--quantization fp8 --pdl on|--decode-batch 1 --context 512"
      "b1_fp8_nopdl|--quantization fp8 --pdl off|--decode-batch 1 --context 512"
      "b1_before|--gemv-split 1 --decode-min-partition 32 --decode-pipeline off|--decode-batch 1 --context 512"
      "b1_split1|--gemv-split 1|--decode-batch 1 --context 512"
      "b1_split4|--gemv-split 4|--decode-batch 1 --context 512"
      "b1_fp8_split1|--quantization fp8 --gemv-split 1|--decode-batch 1 --context 512"
      "b1_fp8_split2|--quantization fp8 --gemv-split 2|--decode-batch 1 --context 512"
      "b1_fp8_split4|--quantization fp8 --gemv-split 4|--decode-batch 1 --context 512"
      "b1_nopipe|--decode-pipeline off|--decode-batch 1 --context 512"
      "b1_minpart8|--decode-min-partition 8|--decode-batch 1 --context 512"
      "b1_minpart32|--decode-min-partition 32|--decode-batch 1 --context 512"
      "b1_ctx4096||--decode-batch 1 --context 4096"
      "b1_ctx4096_minpart128|--decode-min-partition 128|--decode-batch 1 --context 4096"
      "b1_ctx4096_minpart256|--decode-min-partition 256|--decode-batch 1 --context 4096"
      "b1_before_ctx4096|--gemv-split 1 --decode-min-partition 32 --decode-pipeline off|--decode-batch 1 --context 4096"
      "b64_default||--decode-batch 64 --context 1024"
      "b64_nopipe|--decode-pipeline off|--decode-batch 64 --context 1024"
      "b64_pdl|--pdl on|--decode-batch 64 --context 1024"
      "b1_no_graphs||--decode-batch 1 --context 512 --cuda-graphs off"
      "b1_host_sampling||--decode-batch 1 --context 512 --sampling host"
      "b8|--gemv-max-rows 8|--decode-batch 8 --context 512"
      "b8_cublaslt|--gemv-max-rows 0|--decode-batch 8 --context 512"
      # b2_fp8 / b4_fp8 / b8_fp8: the activation quantiser + cuBLASLt FP8 (--fp8-gemv-max-rows 1, the default
      # before 2026-12-06); the _gemv forms: the fp8 GEMV (tensor cores past one row; the default since).
      "b8_fp8|--quantization fp8 --fp8-gemv-max-rows 1|--decode-batch 8 --context 512"
      "b8_fp8_gemv|--quantization fp8 --fp8-gemv-max-rows 8|--decode-batch 8 --context 512"
      "b2_fp8|--quantization fp8 --fp8-gemv-max-rows 1|--decode-batch 2 --context 512"
      "b2_fp8_gemv|--quantization fp8 --fp8-gemv-max-rows 8|--decode-batch 2 --context 512"
      # The fp8 GEMV's CUDA-core kernel past one row (--gemv-split 1: no tensor-core kernel; the lm_head of these
      # steps is cuBLASLt's either way), and batch 4.
      "b2_fp8_gemv_cc|--quantization fp8 --fp8-gemv-max-rows 8 --gemv-split 1|--decode-batch 2 --context 512"
      "b4_fp8|--quantization fp8 --fp8-gemv-max-rows 1|--decode-batch 4 --context 512"
      "b4_fp8_gemv|--quantization fp8 --fp8-gemv-max-rows 8|--decode-batch 4 --context 512"
      "b4_fp8_gemv_cc|--quantization fp8 --fp8-gemv-max-rows 8 --gemv-split 1|--decode-batch 4 --context 512"
      "b8_fp8_gemv_cc|--quantization fp8 --fp8-gemv-max-rows 8 --gemv-split 1|--decode-batch 8 --context 512"
      # PDL in the fp8 GEMV steps past one row: on, off (--pdl auto took it only up to --gemv-max-rows tokens
      # before 2026-12-06; since, up to --fp8-gemv-max-rows with fp8 weights: the _gemv forms have it).
      "b2_fp8_gemv_pdl|--quantization fp8 --fp8-gemv-max-rows 8 --pdl on|--decode-batch 2 --context 512"
      "b8_fp8_gemv_pdl|--quantization fp8 --fp8-gemv-max-rows 8 --pdl on|--decode-batch 8 --context 512"
      "b2_fp8_gemv_nopdl|--quantization fp8 --fp8-gemv-max-rows 8 --pdl off|--decode-batch 2 --context 512"
      "b8_fp8_gemv_nopdl|--quantization fp8 --fp8-gemv-max-rows 8 --pdl off|--decode-batch 8 --context 512"
      "b64_no_graphs||--decode-batch 64 --context 1024 --cuda-graphs off"
      "b64_host_sampling||--decode-batch 64 --context 1024 --sampling host"
      # Mixed steps (decodes + a prompt behind them): the decodes' attention in the decode kernel (split, the
      # default) or every sequence in the prefill kernel (the form before 2026-12-05).
      "b256_mixed1000|--mixed-attention split|--decode-batch 256 --context 1000 --mixed 1000"
      "b256_mixed1000_prefill|--mixed-attention prefill|--decode-batch 256 --context 1000 --mixed 1000"
      "b64_mixed512|--mixed-attention split|--decode-batch 64 --context 1000 --mixed 512"
      "b64_mixed512_prefill|--mixed-attention prefill|--decode-batch 64 --context 1000 --mixed 512"
      # The same over an fp8 cache: now (split, tiled prefill), split with the warp prefill kernel, and the form
      # before 2026-12-05 (every sequence in the warp prefill kernel).
      "b256_mixed1000_fp8kv|--kv-cache-dtype fp8|--decode-batch 256 --context 1000 --mixed 1000"
      "b256_mixed1000_fp8kv_warp|--kv-cache-dtype fp8 --prefill-attention warp|--decode-batch 256 --context 1000 --mixed 1000"
      "b256_mixed1000_fp8kv_before|--kv-cache-dtype fp8 --mixed-attention prefill --prefill-attention warp|--decode-batch 256 --context 1000 --mixed 1000"
    )
    # STEP_AB_ROUNDS=N runs the list N times in turn (round r > 1 writes step_<shape>_<name>_r<r>.json), so
    # that a difference between variants can be told from the drift between processes.
    for round in $(seq 1 "${STEP_AB_ROUNDS:-1}"); do
      for v in "${variants[@]}"; do
        IFS='|' read -r name knobs args <<< "$v"
        # STEP_AB=1 runs them all; STEP_AB="b1_no_graphs b64_no_graphs" only those named.
        [[ "$STEP_AB" == 1 || " $STEP_AB " == *" $name "* ]] || continue
        local tag=$name
        ((round > 1)) && tag=${name}_r$round
        stamp "bench step A/B: $tag ($knobs $args)"
        # shellcheck disable=SC2086  # knobs and args are word lists
        timeout 120 "$STOKE" bench step --model "$MODEL" --device "$DEVICE" --gemm-cache "$GEMM_CACHE" $knobs $args --prefill 0 \
          --iters "${STEP_AB_ITERS:-30}" --json "$OUT/step_${SHAPE}_${tag}.json" >/dev/null ||
          echo "bench step ($tag) failed: exit $?"
      done
    done
  fi

  if [[ -z "${SKIP_SERVE:-}" ]]; then
    local max_conc=0
    for c in $CONC; do (( c > max_conc )) && max_conc=$c; done
    stamp "serve --device $DEVICE (max-num-seqs $max_conc)"
    local log="$OUT/llm_serve.log"
    "$STOKE" serve --model "$MODEL" --device "$DEVICE" --gemm-cache "$GEMM_CACHE" --host 127.0.0.1 --port 0 --max-num-seqs "$max_conc" \
      --max-num-batched-tokens 8192 --max-waiting 4096 --sampling "${SERVE_SAMPLING:-device}" ${LLM_SERVE_ARGS:-} 2> "$log" &
    local pid=$!
    local url=""
    if url=$(serve_url "$log" $pid); then
      stamp "server ready at $url"
      # The device's rates for the doctor's step split: bench step's roofline probe in this call (CUDA only);
      # with SKIP_STEP=1, the probe alone (bench step on a one-layer SmolLM2-shaped model: a few seconds).
      local rates probe_json="$OUT/step_${SHAPE}_b1.json"
      if [[ $DEVICE == cuda ]] && ! grep -q d2d_gbps_read_plus_write "$probe_json" 2>/dev/null; then
        probe_json="$OUT/roofline_probe.json"
        if [[ ! -f $probe_json ]]; then
          timeout 120 "$STOKE" model synth --shape smollm2-135m --layers 1 --seed 1 --out /tmp/stoke_roofline_probe \
            --quiet > /dev/null 2>&1 &&
            timeout 120 "$STOKE" bench step --model /tmp/stoke_roofline_probe --device cuda --decode-batch 1 \
              --context 8 --prefill 0 --iters 2 --warmup 1 --gemm-cache "$GEMM_CACHE" --json "$probe_json" \
              > "$OUT/roofline_probe.log" 2>&1 || echo "roofline probe failed: the doctor runs without the device's rates"
        fi
      fi
      rates=$(python3 -c "
import json, sys
try:
    r = json.load(open(sys.argv[1])).get('device_roofline', {})
    g = max((x.get('tflops', 0) for x in r.get('gemm_bf16', [])), default=0)
    print(('--hbm-gbps %.0f' % r['d2d_gbps_read_plus_write']) + (' --tensor-tflops %.0f' % g if g > 0 else ''))
except Exception:
    pass" "$probe_json")
      local i=0 dur
      for c in $CONC; do
        dur=${DURATIONS[i]:-${DURATIONS[-1]}}
        i=$((i + 1))
        stamp "stoke bench: concurrency $c, $IN in / $OUTLEN out, ${dur} s window"
        # stoke doctor watches the measured window (--load none, after the warm-up, 80 % of it): the verdict,
        # KV use, preemptions and the per-step split (model / host ms, weight and KV bytes, matmul FLOPs, and
        # with $rates the time each takes at the device's rates).
        doctor_watch "$url" "$WARMUP" "$dur" "$OUT/doctor_${SHAPE}${LLM_TAG:-}_c$c" "$rates"
        local dpid=$DOCTOR_PID
        # LLM_TRACE_S: a timeline of that many seconds from the middle of the window, its summary (engine steps,
        # GPU time by kernel per step) in trace_<shape><tag>_c<c>.txt.
        local tpid=""
        if [[ -n "${LLM_TRACE_S:-}" ]]; then
          ( sleep $(( WARMUP + dur / 2 )); timeout $(( LLM_TRACE_S + 90 )) "$STOKE" trace --url "$url" \
              --seconds "$LLM_TRACE_S" -o "$OUT/trace_${SHAPE}${LLM_TAG:-}_c$c.json" \
              > "$OUT/trace_${SHAPE}${LLM_TAG:-}_c$c.txt" 2>&1 || echo "stoke trace c=$c failed: exit $?" ) &
          tpid=$!
        fi
        timeout $(( WARMUP + dur + 240 )) "$STOKE" bench --url "$url" --api openai-completions --concurrency "$c" --temperature 0 \
          --input-len "$IN" --output-len "$OUTLEN" --warmup "$WARMUP" --ramp-up "${LLM_RAMP_S:-0}" \
          --duration "$dur" --window 5 \
          --stability 0 --drain-timeout "${LLM_DRAIN_S:-5}" --timeout 600 --label "$SHAPE synth, stoke cuda, c=$c" \
          --output-dir "$OUT/serve_${SHAPE}${LLM_TAG:-}_c$c" >/dev/null || echo "stoke bench c=$c failed: exit $?"
        python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['points'][0]; print('c=%s: %.0f output tok/s, TTFT p50 %.0f ms, TPOT p50 %.1f ms' % (sys.argv[2], p['throughput']['output_tokens_per_s'], p['ttft_ms']['p50'], p['tpot_ms']['p50']))" "$OUT/serve_${SHAPE}${LLM_TAG:-}_c$c/bench.json" "$c" || true
        wait "$dpid"
        [[ -n "$tpid" ]] && { wait "$tpid"; grep -E "engine steps|GPU time by kernel|%" "$OUT/trace_${SHAPE}${LLM_TAG:-}_c$c.txt" | head -20; }
        grep -E "^(VERDICT|steps:|  at |engine:)" "$OUT/doctor_${SHAPE}${LLM_TAG:-}_c$c.txt" || true
      done
      grep -E "device|loaded|kv" "$log" | head -5
    fi
    kill -TERM $pid 2>/dev/null
    wait $pid 2>/dev/null
  fi

  if [[ -z "${SKIP_HF:-}" ]]; then
    stamp "transformers generate baseline"
    local batches
    batches=$(echo "$CONC" | tr ' ' ',')
    timeout 420 python3 bench/gpu/hf_generate_bench.py --model "$MODEL" --batch "$batches" --input-len "$IN" \
      --output-len "$OUTLEN" --budget-s "$HF_BUDGET" --json "$OUT/hf_generate_${SHAPE}.json" >/dev/null \
      || echo "hf_generate_bench failed: exit $?"
  fi

  stamp "summary"
  python3 - "$OUT" "$SHAPE" "$CONC" "${LLM_TAG:-}" <<'PY'
import json, pathlib, sys
out, shape, conc = pathlib.Path(sys.argv[1]), sys.argv[2], [int(c) for c in sys.argv[3].split()]
tag = sys.argv[4] if len(sys.argv) > 4 else ""  # LLM_TAG: the serve_* folders' suffix
def load(p):
    try:
        return json.loads(p.read_text())
    except Exception as e:  # missing or partial: say so in the summary
        return {"error": f"{p.name}: {e}"}
summary = {"shape": shape, "step": {}, "serving": []}
steps = ["b1", "b64"] + sorted(p.name[len(f"step_{shape}_"):-5] for p in out.glob(f"step_{shape}_*.json")
                               if p.name not in (f"step_{shape}_b1.json", f"step_{shape}_b64.json"))
for b in steps:
    j = load(out / f"step_{shape}_{b}.json")
    d, p, r, x = j.get("decode", {}), j.get("prefill", {}), j.get("device_roofline", {}), j.get("mixed", {})
    summary["step"][b] = {k: v for k, v in {
        "decode_step_ms_median": d.get("step_ms", {}).get("median"), "decode_tokens_per_s": d.get("tokens_per_s"),
        "decode_achieved_gbps": d.get("achieved_gbps"), "hbm_roofline_fraction": d.get("hbm_roofline_fraction"),
        "prefill_tokens_per_s": p.get("tokens_per_s"), "prefill_tflops": p.get("achieved_tflops"),
        "prefill_gemm_fraction": p.get("gemm_fraction"), "d2d_gbps": r.get("d2d_gbps_read_plus_write"),
        "mixed_step_ms_median": x.get("step_ms", {}).get("median"), "mixed_prompt_tokens": x.get("prompt_tokens"),
        "mixed_extra_ms_over_decode": x.get("extra_ms_over_decode"),
        "engine": j.get("engine"), "error": j.get("error")}.items() if v is not None}
hf = load(out / f"hf_generate_{shape}.json")
hf_points = {p["batch"]: p for p in hf.get("points", [])}
for c in conc:
    s = load(out / f"serve_{shape}{tag}_c{c}" / "bench.json")
    pt = (s.get("points") or [{}])[0]
    st = {"output_tokens_per_s": pt.get("throughput", {}).get("output_tokens_per_s"),
          "ttft_ms_p50": pt.get("ttft_ms", {}).get("p50"), "ttft_ms_p99": pt.get("ttft_ms", {}).get("p99"),
          "tpot_ms_p50": pt.get("tpot_ms", {}).get("p50"), "tpot_ms_p99": pt.get("tpot_ms", {}).get("p99"),
          "valid": pt.get("valid"), "error": s.get("error")}
    h = hf_points.get(c, {})
    hs = {"output_tokens_per_s": h.get("output_tokens_per_s"), "ttft_ms_p50": h.get("ttft_ms", {}).get("p50"),
          "ttft_ms_p99": h.get("ttft_ms", {}).get("p99"), "tpot_ms_p50": h.get("tpot_ms", {}).get("p50"),
          "tpot_ms_p99": h.get("tpot_ms", {}).get("p99"), "output_len_measured": h.get("output_len_measured"),
          "reduced_because": h.get("reduced_because"), "error": h.get("error") or hf.get("error")}
    d = load(out / f"doctor_{shape}{tag}_c{c}.json")
    sig = d.get("signals", {})
    st["doctor_verdict"] = (d.get("verdicts") or [{}])[0].get("bottleneck")
    st["step_split"] = {k: sig.get(k) for k in (
        "steps", "engine_busy", "step_ms", "step_model_ms", "step_host_ms", "step_output_ms", "step_decode_tokens",
        "step_prefill_tokens", "step_weight_bytes", "step_kv_bytes", "step_matmul_flops", "step_attention_flops",
        "hbm_gbps", "tensor_tflops", "step_weights_ms", "step_kv_ms", "step_matmul_ms", "step_attention_ms",
        "step_floor_ms", "kv_usage_mean", "kv_usage_max", "preemptions", "running_mean", "waiting_mean")
        if sig.get(k) is not None} or None
    row = {"concurrency": c, "stoke": {k: v for k, v in st.items() if v is not None},
           "transformers": {k: v for k, v in hs.items() if v is not None}}
    if st["output_tokens_per_s"] and hs["output_tokens_per_s"]:
        row["throughput_ratio_stoke_over_hf"] = st["output_tokens_per_s"] / hs["output_tokens_per_s"]
    if st["tpot_ms_p50"] and hs["tpot_ms_p50"]:
        row["tpot_p50_ratio_hf_over_stoke"] = hs["tpot_ms_p50"] / st["tpot_ms_p50"]
    summary["serving"].append(row)
(out / f"llm_bench_summary{tag}.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
PY
  stamp "done"
}
main 2>&1 | tee "$OUT/llm_bench${LLM_TAG:-}.log"
