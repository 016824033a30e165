#!/usr/bin/env bash
# Build llama.cpp's llama-server once, from the llama.cpp source vendored in the llama-cpp-python sdist
# (PyPI has no llama-server wheel and Debian has no llama.cpp). The binary is cached outside git and
# reused; the source and the binary are never committed.
#   usage: tools/build_llama_server.sh [PYTHON]     (env: LLAMA_SERVER_DIR, JOBS)
# The sdist is pinned by version and SHA-256 in tools/llama_sdist.sh, shared with build_llama_cpp.sh.
set -euo pipefail
PY=${1:-python3}
# shellcheck source=tools/llama_sdist.sh
source "$(dirname "$0")/llama_sdist.sh"  # VERSION, SHA256, ARCHIVE, fetch_sdist
DIR=${LLAMA_SERVER_DIR:-${HOME}/.cache/specfuse/llama-server}
BIN="$DIR/bin/llama-server"
JOBS=${JOBS:-2}
if [ -x "$BIN" ]; then echo "llama-server already built: $BIN"; exit 0; fi
command -v cmake >/dev/null || { echo "cmake is needed (apt-get install cmake)"; exit 1; }
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
mkdir -p "$DIR/src"
cd "$DIR/src"
# A source tree unpacked from this exact archive carries this stamp; any other tree is unpacked again.
STAMP="llama_cpp_python-$VERSION/.specfuse-sha256"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$SHA256" ]; then
  rm -rf "llama_cpp_python-$VERSION" build
  fetch_sdist "$PY"
  tar xzf "$ARCHIVE"
  echo "$SHA256" > "$STAMP"
fi
SRC="llama_cpp_python-$VERSION/vendor/llama.cpp"
# No network at build time: no curl, no OpenSSL, no web UI download.
nice -n 19 cmake -S "$SRC" -B build "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
nice -n 19 cmake --build build --target llama-server -j "$JOBS"
mkdir -p "$DIR/bin"
cp build/bin/llama-server "$BIN.tmp"  # one command a line: set -e does not stop inside a && list
mv "$BIN.tmp" "$BIN"
echo "built $BIN"
