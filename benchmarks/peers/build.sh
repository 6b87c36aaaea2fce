#!/usr/bin/env bash
# Builds the benchmarks' peers from the sources export_sources.sh put in .peers/src/:
#   .peers/lib/flashmla_dense.so   (dense)  FlashMLA's SM90 dense decode, its scheduler and combine kernels
#                                  (a Python module: flashmla_dense.dense_decode_fwd)
#   .peers/lib/fa3_mla.so          (fa3)    FlashAttention-3's forward for hdim 64 / hdim_v 512 bf16 (torch
#                                  operators torch.ops.flash_attn_3.*, loaded by torch.ops.load_library)
#   .peers/lib/flashmla_sparse.so  (sparse) FlashMLA's SM90 sparse FP8 decode, DeepSeek-V3.2 layout, h_q 64
#                                  and 128, with the same scheduler and combine (a Python module:
#                                  flashmla_sparse.sparse_decode_fwd; benchmarks/bench_sparse.py)
# with each project's own nvcc flags for sm_90a (FlashMLA's setup.py, FlashAttention's hopper/setup.py,
# minus the kernels the benchmark does not call), against the torch it will be loaded into.
#
#   bash benchmarks/peers/build.sh            # torch from `python3 -c "import torch"`
#   PEERS=sparse bash benchmarks/peers/build.sh   # only some of them (default: "dense fa3 sparse")
#   TORCH_DIR=/path/to/site-packages/torch PYTHON_INCLUDE=/path/to/include/python3.12 \
#     EXTRA_INCLUDE=/path/to/nvidia/cu13/include bash benchmarks/peers/build.sh    # an unpacked wheel
#
# The torch must be the one the benchmark runs with (FlashMLA's binding uses torch's C++ ABI):
# 2.11.0+cu130 on the device machine. CUDA 13 keeps libcu++ under include/cccl, which the host
# compiler needs too. JOBS (default: nproc) compiles run at once; ~20 min with 2 cores, ~2 with 16
# (dense and fa3; sparse alone: two heavy compiles, the V3.2 kernels for h_q 64 and 128).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SRC="$ROOT/.peers/src"; OBJ="$ROOT/.peers/obj"; LIB="$ROOT/.peers/lib"
HERE="$ROOT/benchmarks/peers"
[ -f "$SRC/PINS" ] || { echo "no $SRC/PINS: run benchmarks/peers/export_sources.sh first" >&2; exit 1; }
PY=${PYTHON:-python3}
TORCH_DIR=${TORCH_DIR:-$($PY -c 'import os, torch; print(os.path.dirname(torch.__file__))')}
PYTHON_INCLUDE=${PYTHON_INCLUDE:-$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')}
NVCC=${NVCC:-nvcc}
# The toolkit's root: CUDA_HOME, else where nvcc really lives (it may be a wrapper or a link).
if [ -z "${CUDA_HOME:-}" ]; then
  CUDA_HOME=$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
  [ -n "$CUDA_HOME" ] || CUDA_HOME=/usr/local/cuda
fi
[ -f "$CUDA_HOME/include/cuda_fp16.h" ] || { echo "no CUDA headers under $CUDA_HOME: set CUDA_HOME" >&2; exit 1; }
JOBS=${JOBS:-$(nproc)}
. "$HERE/pins.sh"  # PEERS and want
mkdir -p "$OBJ" "$LIB"

# torch's CUDA headers include cuBLAS / cuSPARSE / cuSOLVER headers: from the toolkit, or from the
# nvidia-* wheels beside torch (site-packages/nvidia/cu13/include), or EXTRA_INCLUDE.
TORCH_INC=(-I"$TORCH_DIR/include" -I"$TORCH_DIR/include/torch/csrc/api/include" -I"$PYTHON_INCLUDE"
           -I"$CUDA_HOME/include" -I"$CUDA_HOME/include/cccl")
[ -d "$TORCH_DIR/../nvidia/cu13/include" ] && TORCH_INC+=(-I"$TORCH_DIR/../nvidia/cu13/include")
[ -n "${EXTRA_INCLUDE:-}" ] && TORCH_INC+=(-I"$EXTRA_INCLUDE")
# What torch.utils.cpp_extension adds to every CUDAExtension compile.
TORCH_DEFS=(-D_GLIBCXX_USE_CXX11_ABI=1 -DTORCH_API_INCLUDE_EXTENSION_H)
TORCH_NVCC=(-D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
            -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr -Xcompiler -fPIC)
SM90=(-gencode arch=compute_90a,code=sm_90a)

# --- FlashMLA (setup.py's flags; FLASH_MLA_DISABLE_FP16: the benchmarks are bf16; its sparse
# decode is bf16 only) ---
M="$SRC/flashmla/csrc"
M_INC=(-I"$M" -I"$M/kerutils/include" -I"$M/sm90" -I"$SRC/cutlass-flashmla/include"
       -I"$SRC/cutlass-flashmla/tools/util/include")
M_NVCC=(-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -Wno-deprecated-declarations
        -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__
        -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math
        "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills,--warn-on-local-memory-usage"
        -lineinfo -DFLASH_MLA_DISABLE_FP16)
M_CXX=(-O3 -std=c++20 -DNDEBUG -Wno-deprecated-declarations -DFLASH_MLA_DISABLE_FP16 -fPIC)

# --- FlashAttention-3 (hopper/setup.py's flags and feature switches) ---
F="$SRC/fa3/hopper"
F_INC=(-I"$F" -I"$SRC/cutlass-fa3/include")
F_FEATURES=(-DFLASHATTENTION_DISABLE_BACKWARD -DFLASHATTENTION_DISABLE_SOFTCAP -DFLASHATTENTION_DISABLE_FP16
            -DFLASHATTENTION_DISABLE_FP8 -DFLASHATTENTION_DISABLE_HDIM96 -DFLASHATTENTION_DISABLE_HDIM128
            -DFLASHATTENTION_DISABLE_HDIM192 -DFLASHATTENTION_DISABLE_HDIM256
            -DFLASHATTENTION_DISABLE_HDIMDIFF192 -DFLASHATTENTION_DISABLE_SM8x)
F_NVCC=(-O3 -std=c++17 --ftemplate-backtrace-limit=0 --use_fast_math --resource-usage -lineinfo
        -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DCUTLASS_ENABLE_GDC_FOR_SM90 -DCUTLASS_DEBUG_TRACE_LEVEL=0
        -DNDEBUG "${F_FEATURES[@]}")
F_CXX=(-O3 -std=c++17 -fPIC -DPy_LIMITED_API=0x03090000 -DTORCH_TARGET_VERSION=0x0209000000000000
       "${F_FEATURES[@]}")

jobs_file="$OBJ/jobs"; : > "$jobs_file"
job() {  # job OUT.o COMMAND...: one compile, its log beside the object
  local line; line=$(printf '%q ' "$@"); echo "${line% }" >> "$jobs_file"  # xargs -L: no trailing blank
}
m_cu() { job "$OBJ/$2.o" "$NVCC" -c "$1" -o "$OBJ/$2.o" "${SM90[@]}" "${TORCH_NVCC[@]}" "${M_NVCC[@]}" "${TORCH_DEFS[@]}" "${M_INC[@]}" "${TORCH_INC[@]}"; }
f_cu() { job "$OBJ/$2.o" "$NVCC" -c "$1" -o "$OBJ/$2.o" "${SM90[@]}" "${TORCH_NVCC[@]}" "${F_NVCC[@]}" "${TORCH_DEFS[@]}" "${F_INC[@]}" "${TORCH_INC[@]}"; }

m_cxx() { job "$OBJ/$2.o" g++ -c "$1" -o "$OBJ/$2.o" "${M_CXX[@]}" "-DTORCH_EXTENSION_NAME=$3" "${TORCH_DEFS[@]}" "${M_INC[@]}" "${TORCH_INC[@]}"; }

# Heaviest first, so that the long compiles start at once.
if want fa3; then
  for v in _paged_split _split _paged "" _packgqa; do
    f_cu "$F/instantiations/flash_fwd_hdim64_512_bf16${v}_sm90.cu" "fa3_hdim64_512${v}"
  done
fi
if want sparse; then
  [ -d "$M/sm90/decode/sparse_fp8" ] ||
    { echo "no FlashMLA sparse sources in $SRC: rerun benchmarks/peers/export_sources.sh" >&2; exit 1; }
  for h in 128 64; do
    m_cu "$M/sm90/decode/sparse_fp8/instantiations/v32_persistent_h$h.cu" "flashmla_sparse_v32_h$h"
  done
fi
want dense && m_cu "$M/sm90/decode/dense/instantiations/bf16.cu" flashmla_bf16
# The scheduler and combine kernels: one object each, linked into both FlashMLA modules.
if want dense || want sparse; then
  m_cu "$M/smxx/decode/combine/combine.cu" flashmla_combine
  m_cu "$M/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu" flashmla_sched
fi
if want fa3; then
  f_cu "$F/flash_fwd_combine.cu" fa3_combine
  f_cu "$F/flash_prepare_scheduler.cu" fa3_prepare_scheduler
fi
want dense && m_cxx "$HERE/flashmla_dense.cpp" flashmla_api flashmla_dense
if want sparse; then
  m_cxx "$HERE/flashmla_sparse.cpp" flashmla_sparse_api flashmla_sparse
  m_cxx "$HERE/flashmla_sparse_unbuilt.cpp" flashmla_sparse_unbuilt flashmla_sparse
fi
if want fa3; then
  job "$OBJ/fa3_api.o" g++ -c "$F/flash_api_stable.cpp" -o "$OBJ/fa3_api.o" "${F_CXX[@]}" "${TORCH_DEFS[@]}" "${F_INC[@]}" "${TORCH_INC[@]}"
  job "$OBJ/fa3_unbuilt.o" g++ -c "$HERE/fa3_unbuilt_kernels.cpp" -o "$OBJ/fa3_unbuilt.o" "${F_CXX[@]}" "${TORCH_DEFS[@]}" "${F_INC[@]}" "${TORCH_INC[@]}"
fi

t0=$SECONDS
echo "compiling $(wc -l < "$jobs_file") files, $JOBS at a time"
# Each line: the object, then its command; the log goes beside the object.
# An object newer than its source is kept (delete .peers/obj for a clean build).
xargs -P "$JOBS" -L 1 bash -c 'o=$0; [ "$o" -nt "$3" ] && exit 0
  "$@" > "$o.log" 2>&1 && echo "  built $(basename "$o")" || { echo "FAILED $(basename "$o"):"; tail -30 "$o.log"; exit 255; }' < "$jobs_file"
echo "compiled in $((SECONDS - t0)) s"

LINK=(-shared -L"$TORCH_DIR/lib" -lc10 -ltorch -ltorch_cpu -ltorch_python -lc10_cuda -ltorch_cuda
      -L"$CUDA_HOME/lib64" -lcudart)
M_COMMON=("$OBJ/flashmla_combine.o" "$OBJ/flashmla_sched.o")
want dense && g++ -o "$LIB/flashmla_dense.so" "$OBJ/flashmla_bf16.o" "${M_COMMON[@]}" "$OBJ/flashmla_api.o" "${LINK[@]}"
want sparse && g++ -o "$LIB/flashmla_sparse.so" "$OBJ"/flashmla_sparse_{v32_h128,v32_h64,api,unbuilt}.o \
  "${M_COMMON[@]}" "${LINK[@]}"
want fa3 && g++ -o "$LIB/fa3_mla.so" "$OBJ"/fa3_*.o "${LINK[@]}"
cp "$SRC/PINS" "$LIB/PINS"
# Every kernel the dispatch names must be defined here (fa3_unbuilt_kernels.cpp and
# flashmla_sparse_unbuilt.cpp list the rest).
if want fa3 && nm -D --undefined-only "$LIB/fa3_mla.so" | grep -E 'run_mha_fwd|run_mha_fwd_combine_' ; then
  echo "fa3_mla.so leaves dispatch targets undefined (above)" >&2; exit 1
fi
if want sparse && nm -D --undefined-only "$LIB/flashmla_sparse.so" | grep -E 'run_|sparse_fp8|head64|head128' ; then
  echo "flashmla_sparse.so leaves dispatch targets undefined (above)" >&2; exit 1
fi
logs=()
want dense && logs+=(flashmla_bf16)
want sparse && logs+=(flashmla_sparse_v32_h128 flashmla_sparse_v32_h64)
want fa3 && logs+=(fa3_hdim64_512_paged_split fa3_hdim64_512)
for f in "${logs[@]}"; do
  grep -h -E "registers|spill" "$OBJ/$f.o.log" | grep -v "^$" | head -4 | sed "s|^|  $f: |"
done
ls -la "$LIB"
