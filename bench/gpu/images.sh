#!/usr/bin/env bash
# Image classifiers on the GPU machine (issue 19). stoke's image models run on the CPU only so far; this
# records what there is: (1) the GPU twin of preprocessing checked against the CPU path (stoke_image_cuda_test,
# gpu-labelled; in the bundle when scripts/bundle.sh built it), (2) bench/gpu/images_bench.py: stoke serve's
# images/s on this host's CPU beside PyTorch eager (GPU fp32/fp16, CPU) and onnxruntime where importable, on
# ResNet-50 and MobileNetV2 at 224x224, with a scores check. A few minutes on an H200 host (killed at 540 s).
#
#   OUT=/some/dir bench/gpu/images.sh       (from the repo root, with .bundle/ from scripts/bundle.sh)
#   STOKE_MODEL_DIR=shared/models bench/gpu/images.sh   adds ppocr-mobile-v2-cls on PNG bytes (no internet
#                                                         there: copy ~/.cache/stoke/models/ppocr-mobile-v2-cls)
#
# Output: $OUT/images_bench.json (images_bench.py's docstring), $OUT/images_bench.log, $OUT/image_cuda_test.log.
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
if [[ -x "$BUNDLE/bin/stoke_image_cuda_test" ]]; then
  timeout 120 "$BUNDLE/bin/stoke_image_cuda_test" > "$OUT/image_cuda_test.log" 2>&1 || rc=1
  tail -3 "$OUT/image_cuda_test.log"
else
  echo "stoke_image_cuda_test not in $BUNDLE/bin (BUNDLE_TARGETS in scripts/bundle.sh)" | tee "$OUT/image_cuda_test.log"
fi
timeout 540 python3 bench/gpu/images_bench.py --stoke "$BUNDLE/bin/stoke" --out "$OUT" 2>&1 | tee "$OUT/images_bench.log"
(( PIPESTATUS[0] == 0 )) || rc=1
exit $rc
