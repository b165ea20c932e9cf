#!/usr/bin/env bash
# Idempotent set-up for a bare Debian 12 (+ CUDA toolkit, optional): Debian packages, then a Python venv
# with the pinned test packages. Safe to run again; it only installs what is missing.
#   scripts/setup.sh            everything (build deps + Python test env)
#   STOKE_SETUP_PY=0 scripts/setup.sh   Debian packages only
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git unzip ca-certificates
  python3 python3-venv python3-dev python3-pip
  libboost-dev nlohmann-json3-dev libopenblas-dev libcli11-dev libutf8proc-dev libpcre2-dev
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  clang libclang-rt-14-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus chromium prometheus-cpp-dev libtomlplusplus-dev
  libjpeg62-turbo-dev libpng-dev
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "[setup] Debian packages present"
fi

[ "${STOKE_SETUP_PY:-1}" = "1" ] || exit 0

# Python test environment. It lives outside the clone, keyed by the hash of its pins
# (${XDG_CACHE_HOME:-~/.cache}/stoke/venv-HASH), so a second clone or a CI re-run reuses it; `.venv` in the
# clone is a symlink to it. A changed pin makes a new one. STOKE_VENV_DIR overrides the location.
REQ=tests/requirements.txt
key=$(cat "$REQ" tests/perf_analyzer.txt | sha256sum | cut -c1-16)
VENV_REAL=${STOKE_VENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/stoke/venv-$key}
stamp="$VENV_REAL/.stoke-req-$key"
if [ ! -f "$stamp" ]; then
  echo "[setup] creating Python test environment in $VENV_REAL (first time: builds llama-cpp-python from source, several minutes)"
  mkdir -p "$(dirname "$VENV_REAL")"
  [ -x "$VENV_REAL/bin/python" ] || python3 -m venv "$VENV_REAL"
  "$VENV_REAL/bin/python" -m pip install -q --upgrade pip==24.3.1
  # llama.cpp built for the CPU only; portable flags so the venv works on any x86-64.
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV_REAL/bin/python" -m pip install -q -r "$REQ"
  touch "$stamp"
else
  echo "[setup] Python test environment up to date ($VENV_REAL)"
fi
if [ "$(readlink .venv 2>/dev/null)" != "$VENV_REAL" ]; then
  rm -rf .venv
  ln -s "$VENV_REAL" .venv
fi

# nvJPEG (the GPU JPEG decoder; the CUDA toolkit here may lack it): the pinned wheel in tests/nvjpeg.txt, found by
# CMake in .venv (cmake/StokeCuda.cmake). Optional for the build; idempotent.
nvjpeg_pin=$(grep -E '^nvidia-nvjpeg==' tests/nvjpeg.txt)
if ! .venv/bin/python -m pip show -q nvidia-nvjpeg 2>/dev/null \
    || [ "$(.venv/bin/python -m pip show nvidia-nvjpeg 2>/dev/null | sed -n 's/^Version: //p')" != "${nvjpeg_pin#*==}" ]; then
  echo "[setup] installing $nvjpeg_pin"
  .venv/bin/python -m pip install -q --no-deps "$nvjpeg_pin" || echo "[setup] $nvjpeg_pin not installed: no GPU JPEG decoding"
fi

# perf_analyzer (the KServe cross-check and the perf_analyzer tests): its own folder beside the venv, because
# the PyPI builds that still run on Debian 12's glibc pin an old numpy. Idempotent.
bash tests/fixtures/install_perf_analyzer.sh
