#!/usr/bin/env bash
# Packs the llama.cpp source for the GPU machine (which has no network) into peers/llama.cpp.tar.xz.
# Runs HERE (the dev machine, PyPI reachable), from anywhere in the repo:
#   1. pip downloads the llama-cpp-python sdist (pinned: LLAMA_CPP_PY_VERSION, the one tests/requirements.txt
#      pins too) into $LLAMA_CPP_PACK_CACHE (default ~/.cache/stoke/peers) and takes its vendor/llama.cpp;
#   2. prunes what a CUDA build of llama-bench, llama-quantize, llama-batched-bench and llama-server does not
#      need: docs, models/ (vocab files), media, tests, examples, benches, pocs, .github/.devops, the Python
#      converters (gguf-py stays: bench/gpu/gguf_from_hf.py falls back on it where pip's gguf is missing), the web UI's sources (the server is built without its UI), the tools not built
#      (tools/CMakeLists.txt is rewritten to list only what is kept), and every ggml backend but CPU and CUDA;
#   3. writes STOKE_PEER_VERSION (pinned version, sdist sha256, what was pruned) at the tree's root and
#      tars it as llama.cpp/ into peers/llama.cpp.tar.xz (about 2.6 MB: 25 MiB of source, xz -9; peers/ is git-ignored).
# Idempotent: nothing is done when the tarball exists and its STOKE_PEER_VERSION names the pinned version.
# PACK_VERIFY=1 also configures the pruned tree (CPU-only, and with -DGGML_CUDA=ON when nvcc exists) in a
# scratch dir, to catch a prune that removed something CMake needs; a full build check is
# `LLAMA_CPP_CUDA=0 bench/gpu/llama_cpp.sh build` (bench/gpu/llama_cpp.sh says more).
# FORCE=1 repacks. Then scripts/bundle.sh puts the tarball in the bundle (.bundle/peers/).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
VERSION=${LLAMA_CPP_PY_VERSION:-0.3.36}
CACHE=${LLAMA_CPP_PACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stoke/peers}
TARBALL=$ROOT/peers/llama.cpp.tar.xz
PY=$ROOT/.venv/bin/python

if [[ -f "$TARBALL" && -z "${FORCE:-}" ]] &&
   tar -xJOf "$TARBALL" llama.cpp/STOKE_PEER_VERSION 2>/dev/null | grep -qx "llama-cpp-python==$VERSION"; then
  echo "llama_cpp_pack: $TARBALL is llama-cpp-python==$VERSION already ($(du -h "$TARBALL" | cut -f1)); FORCE=1 repacks" >&2
  exit 0
fi

if [[ ! -x "$PY" ]]; then
  echo "llama_cpp_pack: .venv missing, running scripts/setup.sh" >&2
  bash scripts/setup.sh
fi

mkdir -p "$CACHE"
SDIST=$CACHE/llama_cpp_python-$VERSION.tar.gz
if [[ ! -f "$SDIST" ]]; then
  "$PY" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$CACHE" >&2
fi
[[ -f "$SDIST" ]] || { echo "llama_cpp_pack: $SDIST not downloaded" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/llama_cpp_pack.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$VERSION/vendor/llama.cpp"
mv "$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp" "$WORK/llama.cpp"
rm -rf "$WORK/llama_cpp_python-$VERSION"
T=$WORK/llama.cpp
before=$(du -sm "$T" | cut -f1)

# Top level: only the build (CMake, sources, vendored headers) and the licences stay.
PRUNED_TOP=(docs models media tests examples benches pocs .github .devops conversion skills ci
  grammars requirements app flake.nix .gitignore .gitmodules .clang-format .clang-tidy .editorconfig
  .flake8 .pre-commit-config.yaml .ecrc .git .gemini .pi .dockerignore Makefile build-xcframework.sh mypy.ini pyrightconfig.json ty.toml
  pyproject.toml poetry.lock requirements.txt AGENTS.md CLAUDE.md CODEOWNERS CONTRIBUTING.md SECURITY.md
  AUTHORS convert_hf_to_gguf.py convert_hf_to_gguf_update.py convert_llama_ggml_to_gguf.py
  convert_lora_to_gguf.py)
for p in "${PRUNED_TOP[@]}"; do rm -rf "${T:?}/$p"; done
# scripts/: only what CMake includes (the UI embedding step runs even with the UI off).
find "$T/scripts" -mindepth 1 -maxdepth 1 ! -name ui-assets.cmake -exec rm -rf {} +
# ggml backends: CPU and CUDA (and BLAS, small, off by default) stay; ggml_add_backend only descends into
# a backend's folder when its GGML_<X> option is on.
for b in cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn; do
  rm -rf "$T/ggml/src/ggml-$b"
done
# tools: keep the four targets and what llama-server links (mtmd, the UI stub library).
KEEP_TOOLS=(batched-bench llama-bench quantize server mtmd ui)
for d in "$T"/tools/*/; do
  n=$(basename "$d")
  [[ " ${KEEP_TOOLS[*]} " == *" $n "* ]] || rm -rf "$d"
done
# The UI: built with LLAMA_BUILD_UI=OFF LLAMA_USE_PREBUILT_UI=OFF, it embeds no assets; only the CMake
# and the templates of the generated ui.cpp/ui.h are needed.
find "$T/tools/ui" -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt ! -name sources.cmake ! -name 'ui.*.in' \
  -exec rm -rf {} +
rm -rf "$T/gguf-py/tests" "$T/gguf-py/examples" "$T/tools/server/tests" "$T/tools/server/bench" "$T/tools/server/public"* "$T/tools/server/themes" \
  "$T/tools/mtmd/tests" "$T/tools/mtmd/test-"* "$T/tools/mtmd/tests.sh"
cat > "$T/tools/CMakeLists.txt" <<'CMAKE'
# Rewritten by stoke's bench/gpu/llama_cpp_pack.sh: only the tools the pruned tree keeps.
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(batched-bench)
add_subdirectory(llama-bench)
add_subdirectory(quantize)
if (LLAMA_BUILD_SERVER)
    add_subdirectory(ui)
    add_subdirectory(server)
endif()
add_subdirectory(mtmd)
CMAKE
find "$T" -name '*.md' ! -name 'LICENSE*' -delete

{
  echo "llama-cpp-python==$VERSION"
  echo "sdist_sha256=$(sha256sum "$SDIST" | cut -d' ' -f1)"
  echo "source=PyPI sdist llama_cpp_python-$VERSION.tar.gz, vendor/llama.cpp"
  echo "packed_by=stoke bench/gpu/llama_cpp_pack.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "pruned_top=${PRUNED_TOP[*]}"
  echo "kept_tools=${KEEP_TOOLS[*]}"
  echo "kept_ggml_backends=cpu cuda blas"
} > "$T/STOKE_PEER_VERSION"
after=$(du -sm "$T" | cut -f1)
echo "llama_cpp_pack: pruned vendor/llama.cpp from ${before} MiB to ${after} MiB" >&2

if [[ -n "${PACK_VERIFY:-}" ]]; then
  common=(-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON)
  cmake -S "$T" -B "$WORK/build-cpu" -DGGML_CUDA=OFF "${common[@]}" > "$WORK/configure-cpu.log" 2>&1 ||
    { tail -30 "$WORK/configure-cpu.log" >&2; echo "llama_cpp_pack: CPU configure of the pruned tree failed" >&2; exit 1; }
  echo "llama_cpp_pack: the pruned tree configures (CPU)" >&2
  if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
    PATH=$PATH:/usr/local/cuda/bin cmake -S "$T" -B "$WORK/build-cuda" -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 "${common[@]}" > "$WORK/configure-cuda.log" 2>&1 ||
      { tail -30 "$WORK/configure-cuda.log" >&2; echo "llama_cpp_pack: CUDA configure of the pruned tree failed" >&2; exit 1; }
    echo "llama_cpp_pack: the pruned tree configures (CUDA, sm_90)" >&2
  fi
  rm -rf "$WORK/build-cpu" "$WORK/build-cuda"
fi

mkdir -p "$ROOT/peers"
tar -C "$WORK" --owner=0 --group=0 --sort=name -cf - llama.cpp | xz -T2 -9 > "$TARBALL.tmp"
mv "$TARBALL.tmp" "$TARBALL"
echo "llama_cpp_pack: wrote $TARBALL ($(du -h "$TARBALL" | cut -f1))" >&2
