#!/usr/bin/env bash
# Build llama.cpp's `llama-server` and its RPC worker (`ggml-rpc-server`) for the CPU with
# RPC support, from the pinned llama-cpp-python source distribution on PyPI (it carries
# llama.cpp under vendor/llama.cpp), and cache the result outside the repository:
#
#   ${LLMGW_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/llmgw}/llama.cpp/<version>-<flags hash>/bin
#
# A machine builds once (about 13 minutes on 2 busy cores); later runs print the cached directory.
# Concurrent runs are safe: one builds under a lock in a temporary directory next to the
# cache and renames it into place; the others wait for the lock and reuse the result.
#
# Usage: scripts/build-llama-cpp.sh           build when missing; print the bin directory
#        scripts/build-llama-cpp.sh --cached  print it when built, else exit 3 (no build)
# The pin (version, sha256, the llama.cpp commit the sdist vendors, cmake flags) lives in
# scripts/llama-cpp.pin; the Ansible engines
# role's defaults hold the same values (tests/engines/test_llamacpp_build.py compares them).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
. "$here/llama-cpp.pin"   # LLAMA_CPP_PY_VERSION, LLAMA_CPP_PY_SHA256, LLAMA_CPP_COMMIT, LLAMA_CPP_CMAKE_FLAGS

py="${LLMGW_PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$here/../.venv/bin/python" ]; then py="$here/../.venv/bin/python"; else py=python3; fi
fi
for tool in cmake c++ flock sha256sum tar; do
  command -v "$tool" >/dev/null || {
    echo "build-llama-cpp: '$tool' is missing; install it (Debian: apt-get install cmake g++ util-linux coreutils tar)" >&2
    exit 1
  }
done

flags_hash="$(printf '%s' "$LLAMA_CPP_CMAKE_FLAGS" | sha256sum | cut -c1-12)"
key="${LLAMA_CPP_PY_VERSION}-${flags_hash}"
root="${LLMGW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llmgw}/llama.cpp"
dest="$root/$key"

complete() {
  [ -x "$dest/bin/llama-server" ] && [ -x "$dest/bin/ggml-rpc-server" ] && [ -f "$dest/build-info.json" ]
}

if complete; then echo "$dest/bin"; exit 0; fi
if [ "${1:-}" = "--cached" ]; then
  echo "build-llama-cpp: no build of $key in $root yet; run \`make llama-cpp\` (about 13 minutes on 2 cores, once per machine)" >&2
  exit 3
fi
mkdir -p "$root"
exec 9>"$root/$key.lock"
if ! flock -n 9; then
  echo "build-llama-cpp: another build of $key is running; waiting for it" >&2
  flock 9
fi
if complete; then echo "$dest/bin"; exit 0; fi

# Holding the lock: a .build-<key>.* directory left here is from a build that was killed.
rm -rf "$root/.build-$key."*
work="$(mktemp -d "$root/.build-$key.XXXXXX")"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
started=$(date +%s)
jobs="${LLMGW_BUILD_JOBS:-$(nproc)}"

sdist="$root/sdist/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz"
if [ ! -f "$sdist" ] || ! echo "$LLAMA_CPP_PY_SHA256  $sdist" | sha256sum -c --status; then
  echo "build-llama-cpp: downloading llama-cpp-python==$LLAMA_CPP_PY_VERSION (source, 76 MB) from PyPI" >&2
  mkdir -p "$work/dl" "$root/sdist"
  "$py" -m pip download -q --no-deps --no-binary :all: \
    "llama-cpp-python==$LLAMA_CPP_PY_VERSION" -d "$work/dl" >&2
  got="$(sha256sum "$work/dl/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz" | cut -d' ' -f1)"
  if [ "$got" != "$LLAMA_CPP_PY_SHA256" ]; then
    echo "build-llama-cpp: sha256 of the downloaded sdist is $got, expected $LLAMA_CPP_PY_SHA256 (scripts/llama-cpp.pin); refusing to build it" >&2
    exit 1
  fi
  mv "$work/dl/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz" "$sdist"
fi

# The llama.cpp commit the sdist vendors (its git metadata for the submodule): the pin's.
vendored="$(tar -xzOf "$sdist" "llama_cpp_python-$LLAMA_CPP_PY_VERSION/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null | tr -d '[:space:]' || true)"
if [ -n "$vendored" ] && [ "$vendored" != "$LLAMA_CPP_COMMIT" ]; then
  echo "build-llama-cpp: llama-cpp-python $LLAMA_CPP_PY_VERSION vendors llama.cpp commit $vendored, not LLAMA_CPP_COMMIT=$LLAMA_CPP_COMMIT (scripts/llama-cpp.pin): correct the pin" >&2
  exit 1
fi
echo "build-llama-cpp: building llama-server and ggml-rpc-server ($key: llama-cpp-python $LLAMA_CPP_PY_VERSION, llama.cpp commit ${LLAMA_CPP_COMMIT:0:9}; -j$jobs; about 13 minutes on 2 cores)" >&2
tar -xzf "$sdist" -C "$work" "llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp"
src="$work/llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp"
# shellcheck disable=SC2086  # the flags are a word list
cmake -S "$src" -B "$work/build" $LLAMA_CPP_CMAKE_FLAGS >"$work/cmake.log" 2>&1 \
  || { tail -n 40 "$work/cmake.log" >&2; echo "build-llama-cpp: cmake configure failed (log above)" >&2; exit 1; }
cmake --build "$work/build" --target llama-server ggml-rpc-server -j "$jobs" >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; echo "build-llama-cpp: the build failed (log above)" >&2; exit 1; }

mkdir -p "$work/out/bin"
# Static build (BUILD_SHARED_LIBS=OFF, no OpenMP): two self-contained binaries that can be
# copied anywhere (the Ansible role, the Molecule container).
cp "$work/build/bin/llama-server" "$work/build/bin/ggml-rpc-server" "$work/out/bin/"
elapsed=$(( $(date +%s) - started ))
cat >"$work/out/build-info.json" <<EOF
{"source": "llama-cpp-python", "version": "$LLAMA_CPP_PY_VERSION", "sha256": "$LLAMA_CPP_PY_SHA256",
 "llama_cpp_commit": "$LLAMA_CPP_COMMIT", "cmake_flags": "$LLAMA_CPP_CMAKE_FLAGS", "rpc": true, "build_seconds": $elapsed,
 "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
EOF
rm -rf "$dest"   # a partial directory can only come from an interrupted older layout
mv "$work/out" "$dest"
echo "build-llama-cpp: built $key (llama.cpp commit ${LLAMA_CPP_COMMIT:0:9}) in ${elapsed}s into $dest" >&2
echo "$dest/bin"
