#include "tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

namespace jax_mla {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn(const char** error) {
  // Resolved once; the function pointer is valid for the life of the process.
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      ptr = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  if (!fn) *error = "cuTensorMapEncodeTiled is not available from the CUDA driver";
  return fn;
}

CUtensorMapDataType type_of(DType dtype) {
  return dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// A tiled tensor map; `what` names the view in the error.
bool encode_tiled(CUtensorMap* map, const void* base, CUtensorMapDataType type, CUtensorMapSwizzle swizzle,
                  cuuint32_t rank, const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                  const char* what, const char** error) {
  auto fn = encode_fn(error);
  if (!fn) return false;
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = fn(map, type, rank, const_cast<void*>(base), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    *error = what;
    return false;
  }
  return true;
}

}  // namespace

bool make_tensor_map_2d(CUtensorMap* map, const void* base, DType dtype, uint64_t rows, uint64_t cols,
                        uint64_t row_stride_elems, uint32_t box_rows, uint32_t box_cols, const char** error) {
  const cuuint64_t dims[2] = {cols, rows};               // innermost first
  const cuuint64_t strides[1] = {row_stride_elems * 2};  // bytes, for dimension 1
  const cuuint32_t box[2] = {box_cols, box_rows};
  return encode_tiled(map, base, type_of(dtype), CU_TENSOR_MAP_SWIZZLE_128B, 2, dims, strides, box,
                      "cuTensorMapEncodeTiled rejected the tensor (alignment or size)", error);
}

bool make_tensor_map_col_boxes(CUtensorMap* map, const void* base, DType dtype, uint64_t rows, uint64_t cols,
                               uint64_t row_stride_elems, uint32_t box_rows, uint32_t boxes, const char** error) {
  const cuuint64_t dims[3] = {64, rows, cols / 64};               // innermost first
  const cuuint64_t strides[2] = {row_stride_elems * 2, 64 * 2};  // bytes, for dimensions 1 and 2
  const cuuint32_t box[3] = {64, box_rows, boxes};
  return encode_tiled(map, base, type_of(dtype), CU_TENSOR_MAP_SWIZZLE_128B, 3, dims, strides, box,
                      "cuTensorMapEncodeTiled rejected the 3-D column-box view (stride order, alignment or size)",
                      error);
}

bool make_tensor_map_bytes(CUtensorMap* map, const void* base, uint64_t rows, uint64_t row_bytes, uint32_t box_rows,
                           uint32_t box_bytes, const char** error) {
  const cuuint64_t dims[2] = {row_bytes, rows};  // innermost first
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_bytes, box_rows};
  return encode_tiled(map, base, CU_TENSOR_MAP_DATA_TYPE_UINT8, CU_TENSOR_MAP_SWIZZLE_NONE, 2, dims, strides, box,
                      "cuTensorMapEncodeTiled rejected the byte view of the cache (alignment or size)", error);
}

}  // namespace jax_mla
