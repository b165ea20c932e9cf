#!/usr/bin/env bash
# Packs Triton's perf_analyzer for the GPU machine (nothing can be installed there): the binary from the test
# venv (tests/fixtures/install_perf_analyzer.sh: tritonclient 2.50.0's wheel) with the two libraries it needs
# that the GPU image lacks, libb64.so.0d (Debian libb64-0d) and libcudart.so.12 (nvidia-cuda-runtime-cu12),
# into peers/perf_analyzer/ (git-ignored; ~21 MB, ~7 MB compressed); scripts/bundle.sh copies it into
# .bundle/peers/perf_analyzer/. On the GPU machine:
#   LD_LIBRARY_PATH=.bundle/peers/perf_analyzer .bundle/peers/perf_analyzer/perf_analyzer -m MODEL -u HOST:PORT -i grpc
# bench/gpu/bert_bench.sh passes it to torch_bert_bench.py --perf-analyzer when it is there.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x .venv/perf_analyzer/bin/perf_analyzer ] || bash tests/fixtures/install_perf_analyzer.sh
cudart=$(.venv/bin/python -c "import nvidia.cuda_runtime, os; print(os.path.join(list(nvidia.cuda_runtime.__path__)[0], 'lib', 'libcudart.so.12'))")
mkdir -p peers/perf_analyzer
cp .venv/perf_analyzer/bin/perf_analyzer peers/perf_analyzer/
cp -L /lib/x86_64-linux-gnu/libb64.so.0d "$cudart" peers/perf_analyzer/
help=$(LD_LIBRARY_PATH=peers/perf_analyzer peers/perf_analyzer/perf_analyzer --help 2>&1 || true)
grep -q SYNOPSIS <<<"$help" || { echo "pack_perf_analyzer: the packed binary does not start here" >&2; exit 1; }
du -sh peers/perf_analyzer
