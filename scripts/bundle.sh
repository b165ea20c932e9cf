#!/usr/bin/env bash
# Builds the release-cuda preset and makes a relocatable bundle in .bundle/ for a GPU host:
#   .bundle/bin/{stoke, stoke_kernels_cuda_test, stoke_device_test, stoke_engine_cuda_test, cuda_bench,
#                stoke_synthetic_cuda_test, stoke_image_cuda_test, stoke_cnn_cuda_test}   (debug info stripped)
#   .bundle/lib/  the non-system shared libraries they need (OpenBLAS, spdlog, fmt, PCRE2, utf8proc, Boost,
#                 gRPC/protobuf/abseil, libstdc++, ...), found with ldd
#   .bundle/peers/perf_analyzer/    when peers/perf_analyzer exists (bench/gpu/pack_perf_analyzer.sh, ~21 MB)
#   .bundle/peers/llama.cpp.tar.xz  when peers/llama.cpp.tar.xz exists (bench/gpu/llama_cpp_pack.sh, ~3 MB):
#                 the llama.cpp source bench/gpu/llama_cpp.sh builds on the GPU host
# The binaries carry RPATH $ORIGIN/../lib (DT_RPATH, so it also applies to the libraries' own dependencies).
# libnvjpeg.so.13 (~6 MiB, ~2.5 MiB gzip'd) comes from the nvidia-nvjpeg wheel in .venv when CMake found it
# (cmake/StokeCuda.cmake): copied like the others, since GPU hosts' toolkits may lack it (checked below). It adds
# ~3.5 MiB to the tarball: the default targets came to 55.4 MiB with it (51.9 without; 2026-12-04), so with
# peers/perf_analyzer (~7 MiB) as well they pass the limit: take a subset then, e.g.
# BUNDLE_TARGETS="stoke stoke_image_cuda_test stoke_cnn_cuda_test" (42 MiB with perf_analyzer).
# Not bundled: glibc's core libraries (the host's are used; built against glibc 2.36 here, the GPU host has
# 2.39), the driver (libcuda) and the CUDA toolkit's libraries (cudart, cuBLAS/cuBLASLt: cuBLASLt alone is
# ~500 MiB), nor cuDNN (libcudnn*.so.9, linked when CMake found it for --conv-backend cudnn: several hundred
# MiB with its engine libraries; the GPU host has them in /usr/lib/x86_64-linux-gnu). The GPU host provides those in /usr/local/cuda/lib64 (CUDA 13.0); scripts/gpu_check.sh puts it on
# LD_LIBRARY_PATH. The bundle travels as .bundle.tar.gz, which must stay under 60 MiB (the device tool
# carries at most 64 MiB).
#
# Usage: scripts/bundle.sh            (from the repo root)
#   BUNDLE_TARGETS="stoke_kernels_cuda_test cuda_bench" scripts/bundle.sh   builds a subset
#   BUNDLE_BUILD_DIR=build/x scripts/bundle.sh                              another build dir
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUNDLE_BUILD_DIR:-build/release-cuda}
TARGETS=${BUNDLE_TARGETS:-"stoke stoke_kernels_cuda_test stoke_device_test stoke_engine_cuda_test cuda_bench stoke_synthetic_cuda_test stoke_image_cuda_test stoke_cnn_cuda_test"}
OUT=.bundle
MAX_MIB=60
JOBS=${JOBS:-2}

# CMake escapes $ORIGIN for the generator (a raw -Wl,-rpath,$ORIGIN in the linker flags is eaten by the shell).
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader, not the shell
cmake --preset release-cuda -B "$BUILD_DIR" -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags" \
  -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' >/dev/null
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j"$JOBS" --target $TARGETS

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for t in $TARGETS; do
  f=$(find "$BUILD_DIR" -type f -name "$t" -perm -u+x | head -1)
  [[ -n "$f" ]] || { echo "bundle: built target $t not found under $BUILD_DIR" >&2; exit 1; }
  cp "$f" "$OUT/bin/$t"
  strip --strip-debug "$OUT/bin/$t"
done

# Libraries the host must provide: glibc's core, the GPU driver and the CUDA toolkit.
is_system() {
  case "$(basename "$1")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*|libutil.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnvidia-*|libnvrtc*) return 0 ;;
    libcudnn*) return 0 ;;  # cuDNN: hundreds of MiB; GPU hosts have libcudnn.so.9 on the linker path
  esac
  [[ "$1" == /usr/local/cuda* ]]
}
copy_deps() {
  ldd "$1" | awk '/=>/ && $3 ~ /^\// {print $3}' | while read -r lib; do
    is_system "$lib" && continue
    name=$(basename "$lib")
    [[ -e "$OUT/lib/$name" ]] && continue
    cp -L "$lib" "$OUT/lib/$name"
    strip --strip-unneeded "$OUT/lib/$name" 2>/dev/null || true
  done
}
for b in "$OUT"/bin/*; do
  readelf -d "$b" | grep -q 'RPATH.*\$ORIGIN/\.\./lib' || { echo "bundle: $b lacks RPATH \$ORIGIN/../lib" >&2; exit 1; }
  copy_deps "$b"
done

if grep -q '^STOKE_NVJPEG_LIBRARY:FILEPATH=/' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
  [[ -e "$OUT/lib/libnvjpeg.so.13" ]] || { echo "bundle: nvJPEG was found at build time but libnvjpeg.so.13 is not in $OUT/lib" >&2; exit 1; }
fi

if [[ -f peers/llama.cpp.tar.xz ]]; then
  mkdir -p "$OUT/peers"
  cp peers/llama.cpp.tar.xz "$OUT/peers/"
fi
if [[ -x peers/perf_analyzer/perf_analyzer ]]; then  # bench/gpu/pack_perf_analyzer.sh
  mkdir -p "$OUT/peers"
  cp -r peers/perf_analyzer "$OUT/peers/"
fi

cat > "$OUT/README.txt" <<TXT
stoke bundle built $(date -u +%Y-%m-%dT%H:%M:%SZ) from commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)
bin/ binaries with RPATH \$ORIGIN/../lib; lib/ their non-system shared libraries.
Needs on the host: glibc >= 2.36, an NVIDIA driver, CUDA 13 runtime + cuBLASLt (LD_LIBRARY_PATH=/usr/local/cuda/lib64).
cuDNN (--conv-backend cudnn) comes from the host (libcudnn.so.9 on the default linker path), never lib/.
nvJPEG (--preprocess nvjpeg) is in lib/ when the build had it ($(ls "$OUT/lib" | grep -c nvjpeg) file(s) here).
Run scripts/gpu_check.sh from the repo root.
TXT

# What travels is the gzip'd tarball (the device tool carries at most 64 MiB; OpenBLAS alone is 35 MiB
# unpacked): scripts/gpu_check.sh unpacks it when .bundle/ is absent.
tar -czf "$OUT.tar.gz" "$OUT"
size_mib=$(( ($(stat -c %s "$OUT.tar.gz") + 1048575) / 1048576 ))
echo "bundle: $OUT is $(du -sm "$OUT" | cut -f1) MiB unpacked, $OUT.tar.gz ${size_mib} MiB ($(ls "$OUT/lib" | wc -l) libraries)" >&2
if (( size_mib > MAX_MIB )); then
  du -sh "$OUT"/bin/* "$OUT"/lib/* | sort -h | tail -10 >&2
  echo "bundle: $OUT.tar.gz over ${MAX_MIB} MiB" >&2
  exit 1
fi
