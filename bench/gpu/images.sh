#!/usr/bin/env bash
# Image classifiers on the GPU machine (issue 19), in one call (about 5 minutes on an H200):
#   1. bench/gpu/images_bench.py --export-only: torchvision's ResNet-50 and MobileNetV2 (seeded random weights)
#      as ONNX into $OUT/models;
#   2. the gpu tests: stoke_image_cuda_test (GPU resize + normalise vs the CPU) and stoke_cnn_cuda_test (the GPU
#      CNN executor vs the CPU one: a small in-memory net with every step kind, RunImages, bad input, and the two
#      exported models via STOKE_CNN_ONNX), each from the bundle when scripts/bundle.sh built it;
#   3. bench/gpu/images_bench.py: stoke serve --device cuda (tensors at batch 1/8/32/64, PNG bytes with
#      --preprocess cpu vs gpu) beside PyTorch eager fp16 and torch.compile, with a scores check.
#
#   scripts/bundle.sh   (BUNDLE_TARGETS must include stoke stoke_image_cuda_test stoke_cnn_cuda_test; the default does)
#   OUT=/some/dir bench/gpu/images.sh       (from the repo root, with .bundle/ or .bundle.tar.gz)
#
# stdout: the tests' summaries, then one JSON line (images_bench.py's summary). Logs and the JSON in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/stoke_gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [[ -d /usr/local/cuda/lib64 ]]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
BUNDLE=${BUNDLE:-.bundle}
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
rc=0
timeout 120 python3 bench/gpu/images_bench.py --stoke "$BUNDLE/bin/stoke" --out "$OUT" --export-only \
  2> "$OUT/export.log" || { rc=1; tail -5 "$OUT/export.log"; }
models=$(ls "$OUT"/models/*.onnx 2>/dev/null | paste -sd, -)
for t in stoke_image_cuda_test stoke_cnn_cuda_test; do
  if [[ -x "$BUNDLE/bin/$t" ]]; then
    STOKE_CNN_ONNX=$models timeout 240 "$BUNDLE/bin/$t" > "$OUT/$t.log" 2>&1 || rc=1
    echo "== $t"
    grep -E "max \|gpu - cpu\||FAILED|Failure|error" "$OUT/$t.log" | head -30
    tail -3 "$OUT/$t.log"
  else
    echo "$t not in $BUNDLE/bin (BUNDLE_TARGETS in scripts/bundle.sh)" | tee "$OUT/$t.log"
  fi
done
timeout 420 python3 bench/gpu/images_bench.py --stoke "$BUNDLE/bin/stoke" --out "$OUT" 2> "$OUT/images_bench.log"
(( $? == 0 )) || { rc=1; tail -20 "$OUT/images_bench.log"; }
exit $rc
