#!/usr/bin/env bash
# Image classifiers on the GPU machine (issue 19). Parts (IMAGES_PARTS, default "tests tensors jpeg"; each a
# few minutes on an H200; run them as separate calls where one call is limited to 10 minutes):
#   (always) bench/gpu/images_bench.py --export-only: torchvision's ResNet-50 and MobileNetV2 (seeded random
#      weights, BatchNorm recalibrated on bench/gpu/photos/ so the logits spread) as ONNX into $OUT/models;
#   tests:   stoke_image_cuda_test (GPU resize + normalise vs the CPU) and stoke_cnn_cuda_test (the GPU CNN
#            executor vs the CPU one: a small in-memory net with every step kind, RunImages, bad input, and the
#            two exported models, passed as `--onnx a.onnx,b.onnx`), from the bundle;
#   tensors: images_bench.py: stoke serve --device cuda on FP32 tensors at batch 1/8/32/64 (with
#            --max-body-bytes 64MiB: a batch of 64 preprocessed images is 38.5 MB) and PNG bytes with
#            --preprocess cpu vs gpu, beside PyTorch eager fp16 and torch.compile, scores vs PyTorch fp32 and
#            (real photos) vs onnxruntime;
#   jpeg:    images_bench.py --jpeg-p99: ResNet-50 on 1920x1280 JPEG photos, --preprocess cpu, gpu and nvjpeg
#            (IMAGES_JPEG_PREPROCESS, comma-separated; IMAGES_POINT_S seconds per concurrency point, default 5;
#            IMAGES_BUDGET_S: the tensors part's time budget, torch.compile only while under 60 % of it;
#            IMAGES_CONV_BACKENDS, e.g. cudnn,im2col: the served tensor figures once per --conv-backend), `stoke
#            bench --bytes-input` at concurrency 1..256 (requests/s at equal p99) and `stoke doctor
#            --bytes-input` against each configuration (host_bound or not).
#
#   scripts/bundle.sh   (BUNDLE_TARGETS must include stoke stoke_image_cuda_test stoke_cnn_cuda_test; the default does)
#   OUT=/some/dir bench/gpu/images.sh                        (from the repo root, with .bundle/ or .bundle.tar.gz)
#   OUT=/some/dir IMAGES_PARTS=jpeg bench/gpu/images.sh      (one part)
#
# stdout: the tests' summaries, then each part's summary lines and one JSON line. Logs and JSON in $OUT
# (images_bench.json, images_jpeg_p99.json, doctor_jpeg_{cpu,gpu}.{json,txt}, bench_jpeg_{cpu,gpu}/).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/stoke_gpu_out}
PARTS=" ${IMAGES_PARTS:-tests tensors jpeg} "
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [[ -d /usr/local/cuda/lib64 ]]; then
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
BUNDLE=${BUNDLE:-.bundle}
if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tar.gz" ]]; then tar -xzf "$BUNDLE.tar.gz"; fi
rc=0
timeout 180 python3 bench/gpu/images_bench.py --stoke "$BUNDLE/bin/stoke" --out "$OUT" --export-only \
  2> "$OUT/export.log" || { rc=1; tail -5 "$OUT/export.log"; }
models=$(ls "$OUT"/models/*.onnx 2>/dev/null | paste -sd, -)
if [[ $PARTS == *" tests "* ]]; then
  for t in stoke_image_cuda_test stoke_cnn_cuda_test; do
    if [[ -x "$BUNDLE/bin/$t" ]]; then
      args=()
      [[ $t == stoke_cnn_cuda_test && -n $models ]] && args=(--onnx "$models")
      timeout 240 "$BUNDLE/bin/$t" "${args[@]}" > "$OUT/$t.log" 2>&1 || rc=1
      echo "== $t"
      grep -E "FAILED|Failure|error" "$OUT/$t.log" | head -30
      # the --onnx lines, per conv backend and batch (cuda_cnn_gpu_test.cc): the figures to pick a backend by
      grep -E "\.onnx fp16 .* batch [0-9]+: max \|gpu - cpu\|" "$OUT/$t.log" | head -40
      tail -3 "$OUT/$t.log"
    else
      echo "$t not in $BUNDLE/bin (BUNDLE_TARGETS in scripts/bundle.sh)" | tee "$OUT/$t.log"
    fi
  done
fi
if [[ $PARTS == *" tensors "* ]]; then
  echo "== tensors (stoke serve --device cuda vs PyTorch)"
  if ! timeout 420 python3 bench/gpu/images_bench.py --stoke "$BUNDLE/bin/stoke" --out "$OUT" \
    --budget-s "${IMAGES_BUDGET_S:-240}" --conv-backends "${IMAGES_CONV_BACKENDS:-}" \
    2> "$OUT/images_bench.log"; then
    rc=1; tail -20 "$OUT/images_bench.log"
  fi
fi
if [[ $PARTS == *" jpeg "* ]]; then
  echo "== jpeg: --preprocess ${IMAGES_JPEG_PREPROCESS:-cpu,gpu,nvjpeg} at equal p99, stoke doctor on each"
  if ! timeout 420 python3 bench/gpu/images_bench.py --stoke "$BUNDLE/bin/stoke" --out "$OUT" --jpeg-p99 \
    --jpeg-preprocess "${IMAGES_JPEG_PREPROCESS:-cpu,gpu,nvjpeg}" --point-s "${IMAGES_POINT_S:-5}" \
    2> "$OUT/images_jpeg_p99.log"; then
    rc=1; tail -20 "$OUT/images_jpeg_p99.log"
  fi
fi
exit $rc
