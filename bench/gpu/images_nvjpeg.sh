#!/usr/bin/env bash
# JPEG inputs served with --preprocess cpu | gpu | nvjpeg on the GPU machine (issue 19; docs/images.md, "nvJPEG on
# the GPU machine"), in one call of about 4 minutes on an H200:
#   1. stoke_image_cuda_test --gtest_filter='*Jpeg*': nvJPEG (hardware and hybrid) vs libjpeg-turbo on photos;
#   2. torchvision's ResNet-50 (seeded random weights) exported to ONNX by bench/gpu/images_bench.py --export-only
#      (skipped when $OUT/models/resnet50.onnx exists);
#   3. bench/gpu/images_nvjpeg.py: stoke serve --device cuda with each --preprocess, perf_analyzer over gRPC on the
#      photos as JPEG bytes at concurrency 1, 8, 32, 128: requests/s, p50, p99, the ledger's stages.
#
#   scripts/bundle.sh   (with peers/perf_analyzer from bench/gpu/pack_perf_analyzer.sh, so the bundle carries it)
#   OUT=/some/dir bench/gpu/images_nvjpeg.sh      (from the repo root, with .bundle/ or .bundle.tar.gz)
#   NVJPEG_BENCH_ARGS="--concurrency 1,16 --modes cpu,nvjpeg" bench/gpu/images_nvjpeg.sh   (a quicker subset)
#
# stdout: the test's per-photo differences, each point, then one JSON line (the summary). $OUT/images_nvjpeg.json.
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
echo "== stoke_image_cuda_test (nvJPEG)"
timeout 120 "$BUNDLE/bin/stoke_image_cuda_test" --gtest_filter='*Jpeg*' > "$OUT/nvjpeg_test.log" 2>&1 || rc=1
grep -E "backend|max \||preprocessed|FAILED|Failure|PASSED|SKIPPED" "$OUT/nvjpeg_test.log" | head -40
if [[ ! -f "$OUT/models/resnet50.onnx" ]]; then
  timeout 180 python3 bench/gpu/images_bench.py --stoke "$BUNDLE/bin/stoke" --out "$OUT" --export-only \
    2> "$OUT/export.log" || { rc=1; tail -5 "$OUT/export.log"; }
fi
PA=$BUNDLE/peers/perf_analyzer/perf_analyzer
[[ -x "$PA" ]] || { echo "no $PA: run bench/gpu/pack_perf_analyzer.sh before scripts/bundle.sh"; exit 1; }
# shellcheck disable=SC2086  # NVJPEG_BENCH_ARGS is a list of flags
timeout 420 python3 bench/gpu/images_nvjpeg.py --stoke "$BUNDLE/bin/stoke" --model "$OUT/models/resnet50.onnx" \
  --perf-analyzer "$PA" --out "$OUT" ${NVJPEG_BENCH_ARGS:-} 2> >(tee "$OUT/images_nvjpeg.log" >&2) || rc=1
exit $rc
