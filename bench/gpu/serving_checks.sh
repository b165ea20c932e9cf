#!/usr/bin/env bash
# Issues 12-14 on the GPU machine, from the repo root with .bundle/ (scripts/bundle.sh) carried along:
#   serving   bench/serving_path.py: the serving path's own cost (zero-cost synthetic model, HTTP and gRPC,
#             c=1 and c=64, 1 MiB inputs); with BEFORE=<an older stoke binary> both alternately
#   ledger    bench/ledger_overhead.py --device cuda: throughput with the ledger on vs --no-ledger (zero-cost
#             synthetic model over KServe HTTP at c=64; a SmolLM2-135M-shaped decoder made by `stoke model
#             synth` on the GPU at c=16)
#   tune      stoke tune on a BERT-base-shaped encoder (`stoke model synth --shape bert-base`) on the GPU,
#             ~128-token inputs, c=16, SLO p99 20 ms, 1 s warm-up + 4 s window, pre-built requests (tune's
#             default), budget 2.5 min. TUNE_GRID=1: also every combination of the same values (46 points,
#             budget 5 min), then bench/tune_compare.py measures the walk's choice and the grid's best two again,
#             alternated over 3 rounds: within 5 % of the grid or not (tune_bert_compare.json). ~7 min in all
#             with the grid (at most ~9: the budgets bound it).
#   tune_llm  stoke tune on the Llama-3.1-8B shape (`stoke model synth --shape llama-3.1-8b`, bf16, random
#             weights) on the GPU: streamed chat, 100 words (~520 tokens) in / 128 out, c=64, SLO TPOT p99
#             50 ms; the decoder walk (max-num-seqs ... async output, KV dtype, fp8 weights: docs/tune.md) with
#             the doctor on every point, 4 s warm-up + 10 s window, budget 5 min (TUNE_LLM_* override). Each
#             point restarts `stoke serve` (~11 s to load the 8B). ~6.5 min with the synth.
# GPU_PARTS picks a subset (default: "serving ledger tune"). Outputs under $OUT: serving_path.json,
# ledger_gpu.json, tune_bert/, tune_bert_grid/, tune_bert_compare.json, tune_llm/ (each tune folder: stoke.toml,
# tune.json, report.html, logs/) and the log files. STOKE=PATH replaces the bundle's binary.
#
#   GPU_PARTS=tune TUNE_GRID=1 bash bench/gpu/serving_checks.sh     # issue 14: BERT-base, walk vs grid
#   GPU_PARTS=tune_llm bash bench/gpu/serving_checks.sh             # issue 14: the 8B decoder walk
# (together ~14 min: over one 10-minute device command, so two commands.)
#
# CPU_DRY_RUN=1: the same steps on the CPU with 1-layer models, short windows and budgets: the plumbing, not a
# measurement (~2 min on 2 cores):
#   CPU_DRY_RUN=1 STOKE=build/release/apps/stoke/stoke GPU_PARTS="tune tune_llm" TUNE_GRID=1 OUT=/tmp/dry \
#     bash bench/gpu/serving_checks.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
BUNDLE=${BUNDLE:-.bundle}
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
STOKE=$(realpath -m "${STOKE:-$BUNDLE/bin/stoke}")
# The bundle's libraries also serve a CPU-only build of an older commit given as BEFORE.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
PARTS=" ${GPU_PARTS:-serving ledger tune} "
want() { [[ $PARTS == *" $1 "* ]]; }
T0=$(date +%s)
stamp() { echo "=== $* (t=$(( $(date +%s) - T0 )) s)"; }
DRY=${CPU_DRY_RUN:-}
DEVICE=cuda
[[ -n $DRY ]] && DEVICE=cpu
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
  if [[ -n $DRY ]]; then
    bert=/tmp/synth_bert_base_1layer synth_extra=(--layers 1) slo=2000 warmup=0.2 window=0.6 budget=1 gbudget=2.5
  else
    bert=/tmp/synth_bert_base synth_extra=() slo=20 warmup=1 window=4 budget=2.5 gbudget=5
  fi
  stamp "tune bert-base"
  "$STOKE" model synth --shape bert-base "${synth_extra[@]}" --quiet --out "$bert" > "$OUT/synth_bert.log" 2>&1 ||
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
  # 4 s windows: 2 s did not separate these configs on the H200 (bench/results/gpu_tune_bert_base_h200_*.json).
  # Batch 64 is left out (>= 2x the concurrency: the walk never measures it), which keeps the grid to 46 points.
  window=${TUNE_WINDOW:-$window} warmup=${TUNE_WARMUP:-$warmup}
  tune_args=(--model "$bert" --device "$DEVICE" --slo-p99-ms "${TUNE_SLO_MS:-$slo}" --workload /tmp/bert_128.jsonl
    --concurrency "${TUNE_CONCURRENCY:-16}" --warmup "$warmup" --window "$window"
    --batch-sizes "${TUNE_BATCH_SIZES:-1,4,8,16,32}" --queue-delays-us 1000,0,5000 --instance-counts 1,2,4
    --confirm-rounds 3)
  "$STOKE" tune "${tune_args[@]}" --budget-min "${TUNE_BUDGET_MIN:-$budget}" --out "$OUT/tune_bert" \
    > "$OUT/tune_bert.log" 2>&1 || echo "tune failed"
  tail -n 40 "$OUT/tune_bert.log"
  if [[ -n "${TUNE_GRID:-}" ]]; then  # every combination of the same values, for comparison
    stamp "tune bert-base --grid"
    "$STOKE" tune "${tune_args[@]}" --grid --budget-min "${TUNE_GRID_BUDGET_MIN:-$gbudget}" \
      --out "$OUT/tune_bert_grid" > "$OUT/tune_bert_grid.log" 2>&1 || echo "tune --grid failed"
    tail -n 12 "$OUT/tune_bert_grid.log"
    stamp "walk vs grid, head to head"
    python3 bench/tune_compare.py --stoke "$STOKE" --walk "$OUT/tune_bert" --grid "$OUT/tune_bert_grid" \
      --workload /tmp/bert_128.jsonl --rounds "${COMPARE_ROUNDS:-3}" --warmup "$warmup" --window "$window" \
      -o "$OUT/tune_bert_compare.json" > "$OUT/tune_bert_compare.log" 2>&1 || echo "tune_compare failed"
    tail -n 12 "$OUT/tune_bert_compare.log"
  fi
fi

if want tune_llm; then
  if [[ -n $DRY ]]; then
    shape=(--shape smollm2-135m --layers 1) model_llm=${LLM_MODEL_DIR:-/tmp/stoke_synth_smollm2_1layer}
    llm_args=(--input-len 16 --output-len 8 --concurrency 4 --warmup 0.2 --window 0.8 --max-num-seqs-values 1,2,4
      --max-num-batched-tokens-values 32,64 --slo-tpot-ms 2000 --budget-min 1.5)
  else
    # c=64: 16 and 32 sequences are below the load, 128 above it (not measured); the default 64 is the baseline.
    shape=(--shape llama-3.1-8b) model_llm=${LLM_MODEL_DIR:-/tmp/stoke_synth_llama-3.1-8b}
    # --input-len counts words of chat text: the synthetic model's tokenizer makes ~5 tokens of each, so 100
    # words are ~520 prompt tokens (tune.json: mean_input_tokens; 512 words were ~2,620 on the H200, and 5 s
    # windows then ended before any request at c=64 did). Windows must outlast a request (~4 s here).
    llm_args=(--input-len "${TUNE_LLM_INPUT_LEN:-100}" --output-len 128 --concurrency "${TUNE_LLM_CONCURRENCY:-64}"
      --warmup "${TUNE_LLM_WARMUP:-4}" --window "${TUNE_LLM_WINDOW:-10}"
      --max-num-seqs-values "${TUNE_LLM_SEQS:-16,32,64,128}"
      --max-num-batched-tokens-values "${TUNE_LLM_TOKENS:-1024,2048,4096,8192}" --slo-tpot-ms "${TUNE_LLM_TPOT_MS:-50}"
      --budget-min "${TUNE_LLM_BUDGET_MIN:-5}" --serve-args "--gemm-cache $OUT/gemm_cache_8b.json")
  fi
  stamp "synth ${shape[*]} -> $model_llm"
  [[ -f "$model_llm/config.json" ]] || timeout 300 "$STOKE" model synth "${shape[@]}" --seed 1 --quiet \
    --out "$model_llm" > "$OUT/synth_llm.log" 2>&1 || echo "synth failed"
  stamp "tune ${shape[1]}"
  "$STOKE" tune --model "$model_llm" --device "$DEVICE" "${llm_args[@]}" --confirm-rounds 2 \
    --out "$OUT/tune_llm" > "$OUT/tune_llm.log" 2>&1 || echo "tune llm failed"
  tail -n 40 "$OUT/tune_llm.log"
fi
stamp "done"
