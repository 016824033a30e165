#!/usr/bin/env bash
# Build llama.cpp once, from the source vendored in the pinned llama-cpp-python sdist
# (tools/llama_sdist.sh), for both of its uses here:
#   - the shared libraries that llama-cpp-python loads (`--quantize gguf`: llama.cpp in this process);
#   - with --server, also llama-server (served members, `bench remote`), linked to the same libraries.
# One CMake tree in the cache serves both, so `make demo` compiles the libraries and a later
# `make test` compiles only the server's own sources on top. PyPI has no llama-server and only an sdist
# of llama-cpp-python (its wheel would compile llama.cpp a second time), so the Python bindings are
# installed from the sdist with LLAMA_BUILD=OFF (Python files only) and pointed at these libraries.
# The build is specific to this machine's CPU (GGML_NATIVE) and is cached outside git, never committed.
# Except AMX: on a CPU with it, -march=native compiles llama.cpp's AMX kernels, and with those this
# version's llama_decode crashed (a segmentation fault at the first decode of smollm2-135m's GGUF,
# plain llama-cpp-python too) on a 2-core Intel Xeon with AMX; there every instruction set up to
# AVX-512's is named instead (GGML_NATIVE=OFF), leaving AMX out. LLAMA_CMAKE_ARGS, if set, decides.
#
#   usage: tools/build_llama.sh PYTHON [--server]      (env: LLAMA_DIR, LLAMA_CMAKE_ARGS, JOBS)
#   LLAMA_CMAKE_ARGS: extra CMake flags, e.g. the AVX2 kernels of a CPU without AVX-512 on one with it:
#     LLAMA_DIR=~/.cache/specfuse/llama.cpp-avx2 \
#     LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
#     tools/build_llama.sh .venv/bin/python --server
set -euo pipefail
PY=${1:?usage: tools/build_llama.sh PYTHON [--server]}
SERVER=${2:-}
# shellcheck source=tools/llama_sdist.sh
source "$(dirname "$0")/llama_sdist.sh"  # VERSION, SHA256, ARCHIVE, fetch_sdist
DIR=${LLAMA_DIR:-${HOME}/.cache/specfuse/llama.cpp}
without_amx() {  # this CPU's instruction sets as CMake flags, AMX left out (see above)
  local flags
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  local args="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  local feature option
  for feature in avx_vnni:AVX_VNNI avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    option=${feature#*:}
    [[ " $flags " == *" ${feature%%:*} "* ]] && args+=" -DGGML_$option=ON"
  done
  echo "$args"
}
if [ -n "${LLAMA_CMAKE_ARGS+set}" ]; then
  EXTRA=$LLAMA_CMAKE_ARGS
elif grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
  EXTRA=$(without_amx)
else
  EXTRA=""
fi
JOBS=${JOBS:-2}
DISKCACHE="diskcache==5.6.3 --hash=sha256:5e31b2d5fbad117cc363ebaf6b689474db18a1f6438bc82358b024abd4c2ca19"
# What the libraries in $DIR/bin were built from; a tree or an install with another identity is redone.
IDENTITY="$VERSION $SHA256 $EXTRA"
BIN="$DIR/bin"
TARGETS=(llama ggml)
[ "$SERVER" = "--server" ] && TARGETS+=(llama-server)

built() {  # every wanted output is in $BIN and was built from this identity
  [ "$(cat "$BIN/.identity" 2>/dev/null)" = "$IDENTITY" ] || return 1
  [ -f "$BIN/libllama.so" ] || return 1
  [ "$SERVER" != "--server" ] || [ -x "$BIN/llama-server" ]
}

if built; then
  echo "llama.cpp $VERSION already built in $BIN"
else
  command -v cmake >/dev/null || { echo "cmake is needed (apt-get install cmake)"; exit 1; }
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  mkdir -p "$DIR/src"
  cd "$DIR/src"
  # A source tree unpacked from this exact archive with these flags carries this stamp; any other
  # tree is unpacked and configured again.
  STAMP="llama_cpp_python-$VERSION/.specfuse-identity"
  if [ "$(cat "$STAMP" 2>/dev/null)" != "$IDENTITY" ]; then
    rm -rf "llama_cpp_python-$VERSION" build
    fetch_sdist "$PY"
    tar xzf "$ARCHIVE"
    echo "$IDENTITY" > "$STAMP"
  fi
  SRC="llama_cpp_python-$VERSION/vendor/llama.cpp"
  # Shared libraries with an $ORIGIN run path: llama-server and the Python bindings load the same
  # files from one folder. No network at build time: no curl, no OpenSSL, no web UI download.
  # shellcheck disable=SC2086,SC2016
  nice -n 19 cmake -S "$SRC" -B build "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_BUILD_RPATH='$ORIGIN' -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $EXTRA >/dev/null
  nice -n 19 cmake --build build --target "${TARGETS[@]}" -j "$JOBS"
  mkdir -p "$BIN.tmp"
  cp -a build/bin/lib*.so* "$BIN.tmp/"
  if [ "$SERVER" = "--server" ]; then cp build/bin/llama-server "$BIN.tmp/"; fi
  echo "$IDENTITY" > "$BIN.tmp/.identity"
  rm -rf "$BIN"
  mv "$BIN.tmp" "$BIN"
  echo "built llama.cpp $VERSION (${TARGETS[*]}) in $BIN"
fi

# The Python bindings: llama-cpp-python's own files, with this build's libraries in its lib folder.
package_dir() {  # where PYTHON imports llama_cpp from; empty where it is not installed
  "$PY" -c "import importlib.util as u; s = u.find_spec('llama_cpp'); print(s.submodule_search_locations[0] if s else '')" 2>/dev/null || true
}
PKG=$(package_dir)
if [ -n "$PKG" ] && [ "$(cat "$PKG/lib/.identity" 2>/dev/null)" = "$IDENTITY" ] \
  && cmp -s "$PKG/lib/libllama.so" "$BIN/libllama.so"; then
  echo "llama-cpp-python $VERSION already installed with these libraries"
  exit 0
fi
WHEEL_GLOB="$DIR/wheel/llama_cpp_python-$VERSION-*.whl"
# shellcheck disable=SC2086
if ! ls $WHEEL_GLOB >/dev/null 2>&1; then
  mkdir -p "$DIR/src" "$DIR/wheel"
  cd "$DIR/src"
  fetch_sdist "$PY"  # checked again, whatever lies in the folder
  # LLAMA_BUILD=OFF: CMake configures but compiles nothing; the wheel holds the Python files only.
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$PY" -m pip wheel -q --no-deps -w "$DIR/wheel.tmp" "$ARCHIVE"
  mv "$DIR"/wheel.tmp/llama_cpp_python-"$VERSION"-*.whl "$DIR/wheel/"
  rmdir "$DIR/wheel.tmp"
fi
echo "$DISKCACHE" > "$DIR/diskcache.txt"
"$PY" -m pip install -q --no-deps --require-hashes -r "$DIR/diskcache.txt"
# shellcheck disable=SC2086
"$PY" -m pip install -q --no-deps --force-reinstall $WHEEL_GLOB
PKG=$(package_dir)
mkdir -p "$PKG/lib"
cp -a "$BIN"/lib*.so* "$PKG/lib/"
cp "$BIN/.identity" "$PKG/lib/.identity"
"$PY" -c "import llama_cpp; llama_cpp.llama_backend_init(); print('llama-cpp-python', llama_cpp.__version__, 'loads', llama_cpp.llama_cpp._base_path)"
