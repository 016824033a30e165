# Sourced by build_llama.sh: the one pinned llama-cpp-python sdist whose vendored llama.cpp it
# compiles, and how it is fetched. pip refuses an archive with another hash (--require-hashes) and the
# archive is checked again before use, so a changed archive (on the index, or left in the folder) is
# never compiled. To move to a new version, change VERSION and SHA256 together (the hash PyPI lists
# for llama_cpp_python-VERSION.tar.gz).
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ARCHIVE="llama_cpp_python-$VERSION.tar.gz"

# fetch_sdist PYTHON: download the pinned archive into the current folder and check its hash.
fetch_sdist() {
  echo "llama-cpp-python==$VERSION --hash=sha256:$SHA256" > pinned.txt
  "$1" -m pip download -q --no-binary llama-cpp-python --no-deps --require-hashes -r pinned.txt -d .
  local got
  got=$(sha256sum "$ARCHIVE" | cut -d' ' -f1)
  if [ "$got" != "$SHA256" ]; then
    rm -f "$ARCHIVE"
    echo "refusing $ARCHIVE: its SHA-256 is $got, the pinned one is $SHA256" >&2
    return 1
  fi
}
