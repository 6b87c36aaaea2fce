#!/usr/bin/env bash
# Builds flashmla_bench: FlashMLA's SM90 dense bf16 decode (its csrc/kernels of spring 2025:
# splitkv_mla.cu, mla_combine.cu, get_mla_metadata.cu and their headers) linked with our driver.cu,
# for timing FlashMLA on the GPU the device tool lends (README.md here). FlashMLA's sources are not
# part of this repository: pass a folder holding them.
#
#   benchmarks/flashmla_baseline/build.sh KERNELS_DIR CUTLASS_INCLUDE_DIR
#
# KERNELS_DIR: FlashMLA's csrc/kernels files (README.md lists the versions used). CUTLASS_INCLUDE_DIR:
# CUTLASS 3.8 headers (pip install --target DIR nvidia-cutlass==3.8.0.0: DIR/cutlass_library/source/
# include); CUTLASS 4.2 compiles too but its decode kernel spills (255 registers), so it is not
# FlashMLA as published. Output: .whl-flashmla/flashmla_bench (git-ignored; the device run carries it).
# Each kernel file takes 1.5-3 minutes on two cores.
set -euo pipefail
[ $# -eq 2 ] || { sed -n 2,13p "$0"; exit 2; }
KERNELS="$(cd "$1" && pwd)"
CUTLASS_INC="$(cd "$2" && pwd)"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${WORK:-/tmp/flashmla_baseline_build}"
mkdir -p "$WORK/src" "$ROOT/.whl-flashmla"
cp "$KERNELS"/*.cu "$KERNELS"/*.h "$WORK/src/"
# Versions of that era include "flash_mla.h", the params header's earlier name: use params.h.
if [ ! -e "$WORK/src/flash_mla.h" ]; then
  sed -i 's/#include "flash_mla.h"/#include "params.h"/' "$WORK/src"/*.cu "$WORK/src"/*.h
fi
# FlashMLA's setup.py flags of that era, plus its own switch to build only the bf16 kernel.
FLAGS=(-O3 -std=c++17 -DNDEBUG -D_USE_MATH_DEFINES -Wno-deprecated-declarations
       -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__
       -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math
       "--ptxas-options=-v,--register-usage-level=10" -gencode arch=compute_90a,code=sm_90a
       -DFLASH_MLA_DISABLE_FP16 -I"$WORK/src" -I"$CUTLASS_INC")
objs=()
for f in splitkv_mla mla_combine get_mla_metadata; do
  echo "compiling $f.cu"
  nvcc "${FLAGS[@]}" -c "$WORK/src/$f.cu" -o "$WORK/$f.o" > "$WORK/$f.log" 2>&1 || { tail -20 "$WORK/$f.log"; exit 1; }
  objs+=("$WORK/$f.o")
done
echo "compiling driver.cu"
nvcc "${FLAGS[@]}" -c "$HERE/driver.cu" -o "$WORK/driver.o" > "$WORK/driver.log" 2>&1 || { tail -20 "$WORK/driver.log"; exit 1; }
# Static cudart; no -lcuda: CUTLASS reaches cuTensorMapEncodeTiled through the runtime's entry points.
nvcc -gencode arch=compute_90a,code=sm_90a -cudart static -o "$ROOT/.whl-flashmla/flashmla_bench" "$WORK/driver.o" "${objs[@]}"
grep -h "registers\|spill" "$WORK/splitkv_mla.log" | grep -i "splitkv\|Used" | head -4 || true
echo "wrote $ROOT/.whl-flashmla/flashmla_bench"
