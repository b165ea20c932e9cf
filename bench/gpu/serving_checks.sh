#!/usr/bin/env bash
# Issues 12-14 on the GPU machine, from the repo root with .bundle/ (scripts/bundle.sh) carried along:
#   serving   bench/serving_path.py: the serving path's own cost (zero-cost synthetic model, HTTP and gRPC,
#             c=1 and c=64, 1 MiB inputs); with BEFORE=<an older stoke binary> both alternately
#   ledger    bench/ledger_overhead.py --device cuda: throughput with the ledger on vs --no-ledger (zero-cost
#             synthetic model over KServe HTTP at c=64; a SmolLM2-135M-shaped decoder made by `stoke model
#             synth` on the GPU at c=16)
#   tune      stoke tune on a BERT-base-shaped encoder (`stoke model synth --shape bert-base`) on the GPU,
#             ~128-token inputs, SLO p99 20 ms (TUNE_GRID=1: also every combination of the same values)
#   tune_llm  stoke tune on the Llama-3.1-8B shape (`stoke model synth --shape llama-3.1-8b`, bf16, random
#             weights) on the GPU: streamed chat, 512 in / 128 out, c=64, SLO TPOT p99 50 ms; the decoder walk
#             (max-num-seqs, max-num-batched-tokens, chunked prefill, CUDA graphs) with the doctor on every
#             point. Each point restarts `stoke serve` (~11 s to load the 8B), so it is the longest part.
# GPU_PARTS picks a subset (default: "serving ledger tune"). Outputs under $OUT: serving_path.json,
# ledger_gpu.json, tune_bert/ and tune_llm/ (stoke.toml, tune.json, report.html, logs), log files.
#
#   GPU_PARTS="tune tune_llm" bash bench/gpu/serving_checks.sh     # issue 14's two GPU runs, ~6 min
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
BUNDLE=${BUNDLE:-.bundle}
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
STOKE=$PWD/$BUNDLE/bin/stoke
# The bundle's libraries also serve a CPU-only build of an older commit given as BEFORE.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
PARTS=" ${GPU_PARTS:-serving ledger tune} "
want() { [[ $PARTS == *" $1 "* ]]; }
T0=$(date +%s)
stamp() { echo "=== $* (t=$(( $(date +%s) - T0 )) s)"; }
COMMIT=$(cat "$BUNDLE/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)

if want serving; then
  stamp "serving path"
  before=()
  [[ -n "${BEFORE:-}" ]] && before=(--before "$BEFORE" --before-commit "${BEFORE_COMMIT:-unknown}")
  python3 bench/serving_path.py --stoke "$STOKE" --commit "$COMMIT" "${before[@]}" --reps "${SERVING_REPS:-3}" \
    -o "$OUT/serving_path.json" > "$OUT/serving_path.log" 2>&1 || echo "serving_path failed"
  tail -n 30 "$OUT/serving_path.log"
fi

if want ledger; then
  stamp "ledger overhead"
  "$STOKE" model synth --shape smollm2-135m --out /tmp/synth_smollm2 > "$OUT/synth_smollm2.log" 2>&1 ||
    echo "synth failed"
  python3 bench/ledger_overhead.py --stoke "$STOKE" --device cuda --llm-model /tmp/synth_smollm2 \
    --rounds "${LEDGER_ROUNDS:-6}" --seconds 5 --llm-seconds 8 --out "$OUT/ledger_gpu.json" \
    --keep "$OUT/ledger_logs" > "$OUT/ledger.log" 2>&1 || echo "ledger_overhead failed"
  tail -n 30 "$OUT/ledger.log"
fi

if want tune; then
  stamp "tune bert-base"
  "$STOKE" model synth --shape bert-base --out /tmp/synth_bert_base > "$OUT/synth_bert.log" 2>&1 ||
    echo "synth failed"
  # ~128 tokens a request: 100 words drawn from a fixed list (the synthetic WordPiece vocabulary splits them).
  python3 - > /tmp/bert_128.jsonl <<'EOF'
import json, random
random.seed(7)
words = ("the model serves requests on the gpu and every batch waits for its turn while the queue grows "
         "latency throughput memory bandwidth compute kernel launch tensor core cache page token").split()
for _ in range(256):
    print(json.dumps({"input": " ".join(random.choice(words) for _ in range(100))}))
EOF
  tune_args=(--model /tmp/synth_bert_base --device cuda --slo-p99-ms 20 --workload /tmp/bert_128.jsonl
    --concurrency "${TUNE_CONCURRENCY:-16}" --warmup 1 --window "${TUNE_WINDOW:-3}" --batch-sizes 1,4,8,16,32,64
    --queue-delays-us 1000,0,5000 --instance-counts 1,2,4 --confirm-rounds 3 --budget-min "${TUNE_BUDGET_MIN:-5}")
  "$STOKE" tune "${tune_args[@]}" --out "$OUT/tune_bert" > "$OUT/tune_bert.log" 2>&1 || echo "tune failed"
  tail -n 40 "$OUT/tune_bert.log"
  if [[ -n "${TUNE_GRID:-}" ]]; then  # every combination of the same values, for comparison
    stamp "tune bert-base --grid"
    "$STOKE" tune "${tune_args[@]}" --grid --out "$OUT/tune_bert_grid" > "$OUT/tune_bert_grid.log" 2>&1 ||
      echo "tune --grid failed"
    tail -n 12 "$OUT/tune_bert_grid.log"
  fi
fi
if want tune_llm; then
  MODEL_8B=${LLM_MODEL_DIR:-/tmp/stoke_synth_llama-3.1-8b}
  stamp "synth llama-3.1-8b -> $MODEL_8B"
  [[ -f "$MODEL_8B/config.json" ]] || timeout 300 "$STOKE" model synth --shape llama-3.1-8b --seed 1 \
    --out "$MODEL_8B" > "$OUT/synth_8b.log" 2>&1 || echo "synth failed"
  stamp "tune llama-3.1-8b"
  # c=64: 16 and 32 sequences are below the load, 128 above it (not measured); the default 64 is the baseline.
  "$STOKE" tune --model "$MODEL_8B" --device cuda --slo-tpot-ms "${TUNE_LLM_TPOT_MS:-50}" \
    --concurrency "${TUNE_LLM_CONCURRENCY:-64}" --input-len 512 --output-len 128 --warmup 2 \
    --window "${TUNE_LLM_WINDOW:-4}" --max-num-seqs-values 16,32,64,128 \
    --max-num-batched-tokens-values 1024,2048,4096,8192 --confirm-rounds 2 --budget-min "${TUNE_LLM_BUDGET_MIN:-5}" \
    --serve-args "--gemm-cache $OUT/gemm_cache_8b.json" --out "$OUT/tune_llm" > "$OUT/tune_llm.log" 2>&1 ||
    echo "tune llm failed"
  tail -n 40 "$OUT/tune_llm.log"
fi
stamp "done"
