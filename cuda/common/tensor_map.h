// Host-side TMA descriptors (CUtensorMap) for the decode kernels. Encoding is a pure host
// computation (no GPU work, no stream), so it is safe inside the FFI execute stage and under
// CUDA-graph capture. The driver entry point is fetched through the runtime, so the extension
// does not link libcuda and still imports on machines without a driver.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "params.h"

namespace jax_mla {

// 2-D row-major tensor of 16-bit elements: (rows, cols) with `row_stride_elems` between rows,
// read in boxes of (box_rows, box_cols) with the 128-byte swizzle (box_cols * 2 must be 128).
// Returns false (and leaves `map` undefined) if the driver rejects it; `error` says why.
bool make_tensor_map_2d(CUtensorMap* map, const void* base, DType dtype, uint64_t rows, uint64_t cols,
                        uint64_t row_stride_elems, uint32_t box_rows, uint32_t box_cols, const char** error);

}  // namespace jax_mla
