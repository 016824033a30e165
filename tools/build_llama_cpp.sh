#!/usr/bin/env bash
# Build llama-cpp-python (llama.cpp in this process, for `--quantize gguf`) once, from the same
# pinned sdist tools/build_llama_server.sh compiles (tools/llama_sdist.sh), and install it into the given python's venv.
# PyPI has only the sdist; the wheel it builds is specific to this machine's CPU (GGML_NATIVE), so it
# is cached outside git and reused, never committed.
#   usage: tools/build_llama_cpp.sh [PYTHON]     (env: LLAMA_CPP_DIR, JOBS)
# Only the libraries the bindings load are built: no llava/mtmd, server, tools, tests or examples.
# Installed without its dependencies: the project's venv has numpy, jinja2 and typing-extensions
# already, and diskcache comes here, hash-pinned.
set -euo pipefail
PY=${1:-python3}
# shellcheck source=tools/llama_sdist.sh
source "$(dirname "$0")/llama_sdist.sh"  # VERSION, SHA256, ARCHIVE, fetch_sdist
DISKCACHE="diskcache==5.6.3 --hash=sha256:5e31b2d5fbad117cc363ebaf6b689474db18a1f6438bc82358b024abd4c2ca19"
DIR=${LLAMA_CPP_DIR:-${HOME}/.cache/specfuse/llama-cpp}
JOBS=${JOBS:-2}
WHEEL_GLOB="$DIR/wheel/llama_cpp_python-$VERSION-*.whl"
if "$PY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null; then
  echo "llama-cpp-python $VERSION already installed"; exit 0
fi
mkdir -p "$DIR/src" "$DIR/wheel"
# shellcheck disable=SC2086
if ! ls $WHEEL_GLOB >/dev/null 2>&1; then
  command -v cmake >/dev/null || { echo "cmake is needed (apt-get install cmake)"; exit 1; }
  cd "$DIR/src"
  fetch_sdist "$PY"
  export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
  export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF"
  nice -n 19 "$PY" -m pip wheel -q --no-deps -w "$DIR/wheel.tmp" "$ARCHIVE"
  mv "$DIR"/wheel.tmp/llama_cpp_python-"$VERSION"-*.whl "$DIR/wheel/"
  rmdir "$DIR/wheel.tmp"
fi
echo "$DISKCACHE" > "$DIR/diskcache.txt"
"$PY" -m pip install -q --no-deps --require-hashes -r "$DIR/diskcache.txt"
# shellcheck disable=SC2086
"$PY" -m pip install -q --no-deps $WHEEL_GLOB
echo "installed llama-cpp-python $VERSION"
