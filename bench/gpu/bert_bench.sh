#!/usr/bin/env bash
# BERT on the GPU machine (issue 6): stoke's CUDA encoder vs PyTorch fp16 eager (bert-base seq 128, bert-large
# seq 384, batch 1..256), stoke vs transformers pooled-embedding cosine on the same random folders, and
# `stoke serve --device cuda` with dynamic batching off vs on. About 4-5 minutes on an H200 (killed at 560 s;
# the JSON is written after each shape, so a partial run still leaves results).
#
#   OUT=/some/dir bench/gpu/bert_bench.sh            (from the repo root, with .bundle/ from scripts/bundle.sh)
#   BERT_BENCH_ARGS="--no-serve --shapes bert-base:128" bench/gpu/bert_bench.sh     (a quicker subset)
#   BERT_BENCH_ARGS="--no-serve --quantization none,fp8,int8" bench/gpu/bert_bench.sh  (bf16, fp8 and int8 weights)
#
# Output: $OUT/bert_bench.json (see bench/gpu/torch_bert_bench.py for its fields), $OUT/bert_bench.log.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
if [[ -d /usr/local/cuda/lib64 ]]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
BUNDLE=${BUNDLE:-.bundle}
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
# shellcheck disable=SC2086  # BERT_BENCH_ARGS is a list of flags
PA=()
[[ -x "$BUNDLE/peers/perf_analyzer/perf_analyzer" ]] && PA=(--perf-analyzer "$BUNDLE/peers/perf_analyzer/perf_analyzer")
timeout 560 python3 bench/gpu/torch_bert_bench.py --stoke "$BUNDLE/bin/stoke" --out "$OUT" "${PA[@]}" \
  ${BERT_BENCH_ARGS:-} 2>&1 | tee "$OUT/bert_bench.log"
exit "${PIPESTATUS[0]}"
