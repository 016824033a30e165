#!/usr/bin/env bash
# Build llama.cpp's llama-server once, from the llama.cpp source vendored in the llama-cpp-python sdist
# (PyPI has no llama-server wheel and Debian has no llama.cpp). The binary is cached outside git and
# reused; the source and the binary are never committed.
#   usage: tools/build_llama_server.sh [PYTHON]     (env: LLAMA_SERVER_DIR, JOBS)
set -euo pipefail
PY=${1:-python3}
VERSION=0.3.36
DIR=${LLAMA_SERVER_DIR:-${HOME}/.cache/specfuse/llama-server}
BIN="$DIR/bin/llama-server"
JOBS=${JOBS:-2}
if [ -x "$BIN" ]; then echo "llama-server already built: $BIN"; exit 0; fi
command -v cmake >/dev/null || { echo "cmake is needed (apt-get install cmake)"; exit 1; }
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
mkdir -p "$DIR/src"
cd "$DIR/src"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
  "$PY" -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d .
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
SRC="llama_cpp_python-$VERSION/vendor/llama.cpp"
# No network at build time: no curl, no OpenSSL, no web UI download.
nice -n 19 cmake -S "$SRC" -B build "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
nice -n 19 cmake --build build --target llama-server -j "$JOBS"
mkdir -p "$DIR/bin"
cp build/bin/llama-server "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "built $BIN"
