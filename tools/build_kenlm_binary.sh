#!/usr/bin/env bash
# Usage: tools/build_kenlm_binary.sh PYTHON OUT
# Compiles KenLM's build_binary (ARPA text -> KenLM binary model, used by `b2t-lm build -o
# lm.bin`) to OUT. No registry ships it as a program and no KenLM Python module can write a
# binary, so we build it from the kenlm sdist's own sources, fetched with PYTHON's pip and
# checked against a pinned hash: g++ only (no cmake, no Boost, no zlib: our ARPA files are
# plain text), about 20 s on one core. OUT appears only once it is complete.
set -euo pipefail
python=$1 out=$2
version=0.3.0
sha256=c4628bb9fb63c8a6f9240035b8b037385cfc404cb72e933cf48878291edac1e8
work=$(mktemp -d)
trap 'rm -rf "$work" "$out.part"' EXIT
"$python" -m pip download -q --no-deps -d "$work" "kenlm==$version"
echo "$sha256  $work/kenlm-$version.tar.gz" | sha256sum -c --quiet -
tar xzf "$work/kenlm-$version.tar.gz" -C "$work"
src=$work/kenlm-$version
mkdir -p "$(dirname "$out")"
out=$(realpath "$out")
# The library sources setup.py compiles (no *main.cc, no *test.cc), plus build_binary's main.
sources=$(cd "$src" && ls util/*.cc lm/*.cc util/double-conversion/*.cc | grep -v -e 'main\.cc$' -e 'test\.cc$')
(cd "$src" && g++ -O2 -DNDEBUG -DKENLM_MAX_ORDER=6 -DHAVE_CLOCKGETTIME -std=c++11 -w -I. \
    lm/build_binary_main.cc $sources -lrt -o "$out.part")
mv "$out.part" "$out"
