#!/usr/bin/env bash
# The wheels a device run carries (benchmarks/device_run.sh): .whl-dist from the working tree, and
# for each NAME=REV[+REV...] a .whl-NAME built from HEAD with those commits cherry-picked (in a
# temporary worktree; the working tree is not touched). For A/B runs of experiments that live in the
# history as a commit and its revert:
#
#   bash benchmarks/build_wheels.sh exp=8c9a9d1
#   # then, on the device: AB_WHEELS=.whl-exp AB_VARIANTS="X=main PYTHONPATH=/tmp/site-exp ..." \
#   #   bash benchmarks/device_run.sh ab
#
# Environment: PY (the Python that builds; default pyenv's 3.12, the device's, else python3),
# ARCHS (JAX_MLA_CUDA_ARCHS, default 90a-real: the device machines are H100 / H200), NO_DIST=1 (skip
# .whl-dist). Build folders stay in build/wheel-NAME, so a rebuild is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
if [ -z "${PY:-}" ]; then
  PY=python3
  command -v pyenv >/dev/null && [ -x "$(pyenv root)/versions/3.12.1/bin/python3.12" ] &&
    PY="$(pyenv root)/versions/3.12.1/bin/python3.12"
fi
ARCHS=${ARCHS:-90a-real}

build() {  # source folder, wheel folder, build folder
  rm -rf "$2"
  (cd "$1" && JAX_MLA_CUDA=ON "$PY" -m pip wheel . --no-deps -q -w "$2" \
     -C cmake.define.JAX_MLA_CUDA_ARCHS="$ARCHS" -C "cmake.define.JAX_MLA_CUDA_PTX=" -C build-dir="$3")
  echo "built $(ls "$2"/*.whl) from $4"
}

for spec in "$@"; do
  name=${spec%%=*}
  revs=${spec#*=}
  [ "$name" != "$spec" ] && [ -n "$name" ] && [ -n "$revs" ] || { echo "expected NAME=REV[+REV...], got '$spec'" >&2; exit 2; }
  for rev in ${revs//+/ }; do
    git rev-parse -q --verify "$rev^{commit}" >/dev/null || { echo "$spec: no commit $rev" >&2; exit 2; }
  done
done
[ "${NO_DIST:-0}" = 1 ] || build "$ROOT" "$ROOT/.whl-dist" "$ROOT/build/wheel-dist" "the working tree"
for spec in "$@"; do
  name=${spec%%=*}
  revs=${spec#*=}
  wt=$(mktemp -d)/src
  git worktree add -q --detach "$wt" HEAD
  trap 'git -C "$ROOT" worktree remove --force "$wt" 2>/dev/null || true' EXIT
  for rev in ${revs//+/ }; do
    git -C "$wt" cherry-pick --no-commit "$rev" || { echo "cherry-pick of $rev onto HEAD failed" >&2; exit 1; }
  done
  build "$wt" "$ROOT/.whl-$name" "$ROOT/build/wheel-$name" "HEAD + $revs"
  git worktree remove --force "$wt"
  trap - EXIT
done
