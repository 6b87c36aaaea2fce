#!/usr/bin/env bash
# Exports the peers' sources at their pinned commits from git snapshots into .peers/src/ (ignored):
# FlashMLA's SM90 dense decode and SM90 sparse FP8 decode with their scheduler and combine, FlashAttention-3's hopper/ sources
# for the hdim 64 / hdim_v 512 bf16 forward, and the CUTLASS headers of each one's submodule commit.
# Nothing of theirs is committed here: this script and build.sh make the benchmark's peers from a
# snapshot of each public repository.
#
#   bash benchmarks/peers/export_sources.sh FLASHMLA_GIT FLASH_ATTENTION_GIT CUTLASS_GIT
#   PEERS=sparse bash benchmarks/peers/export_sources.sh FLASHMLA_GIT - CUTLASS_GIT
#
# Each argument is a git directory holding that repository's history (a clone, or the `fetch`
# tool's snapshot, e.g. /work/.mirror/deepseek-ai+FlashMLA/repo). PEERS (as build.sh's; default
# "dense fa3 sparse"): without fa3, FlashAttention-3 and its CUTLASS are not exported (29 MB instead
# of 57, small enough to carry to the device beside a wheel) and FLASH_ATTENTION_GIT may be "-".
set -euo pipefail
[ $# -eq 3 ] || { sed -n 2,13p "$0"; exit 2; }
FLASHMLA_GIT=$1 FA_GIT=$2 CUTLASS_GIT=$3
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/pins.sh"
DEST="$(cd "$HERE/../.." && pwd)/.peers/src"
rm -rf "$DEST"; mkdir -p "$DEST"

export_tree() {  # export_tree GIT_DIR COMMIT DEST PATH...
  local git=$1 commit=$2 dest=$3; shift 3
  mkdir -p "$dest"
  git --git-dir="$git" cat-file -e "$commit^{commit}" || { echo "$git has no commit $commit" >&2; exit 1; }
  git --git-dir="$git" archive "$commit" -- "$@" | tar -x -C "$dest"
}

# FlashMLA: the dense and sparse decodes' interface headers and what they include: the SM90 dense
# decode, the SM90 sparse FP8 decode (csrc/sm90/decode/sparse_fp8), their scheduler and combine
# (csrc/smxx/decode), and only the declarations of the SM100 sparse-decode kernels that
# sparse_decode.h dispatches to (no SM100 kernel is built: flashmla_sparse_unbuilt.cpp).
export_tree "$FLASHMLA_GIT" "$FLASHMLA_COMMIT" "$DEST/flashmla" \
  csrc/api/common.h csrc/api/dense_decode.h csrc/api/sparse_decode.h csrc/params.h csrc/defines.h \
  csrc/utils.h csrc/kerutils csrc/sm90/helpers.h csrc/sm90/decode/dense csrc/sm90/decode/sparse_fp8 \
  csrc/sm100/decode/head64/kernel.h csrc/sm100/prefill/sparse/fwd_for_small_topk/head128/phase1.h \
  csrc/smxx/decode
export_tree "$CUTLASS_GIT" "$FLASHMLA_CUTLASS_COMMIT" "$DEST/cutlass-flashmla" include tools/util/include

# FlashAttention-3: hopper/'s headers and API, the combine and scheduler kernels, and the five
# hdim 64 / 512 bf16 SM90 forward instantiations its dispatch can pick for paged MLA decode.
if want fa3; then
  fa_files=$(git --git-dir="$FA_GIT" ls-tree --name-only "$FA_COMMIT" hopper/ |
             grep -E '\.(h|hpp|cpp|cu)$' | grep -v -E '^hopper/(test_|benchmark_)')
  fa_inst=""
  for v in "" _packgqa _paged _split _paged_split; do
    fa_inst="$fa_inst hopper/instantiations/flash_fwd_hdim64_512_bf16${v}_sm90.cu"
  done
  # shellcheck disable=SC2086
  export_tree "$FA_GIT" "$FA_COMMIT" "$DEST/fa3" $fa_files $fa_inst
  export_tree "$CUTLASS_GIT" "$FA_CUTLASS_COMMIT" "$DEST/cutlass-fa3" include
fi

{
  echo "flashmla $FLASHMLA_COMMIT cutlass $FLASHMLA_CUTLASS_COMMIT"
  if want fa3; then echo "flash-attention $FA_COMMIT cutlass $FA_CUTLASS_COMMIT"; fi
} > "$DEST/PINS"
echo "exported to $DEST ($(du -sh "$DEST" | cut -f1)):"; cat "$DEST/PINS"
