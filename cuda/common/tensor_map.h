// Host-side TMA descriptors (CUtensorMap) for the decode kernels. Encoding is a pure host
// computation (no GPU work, no stream), so it is safe inside the FFI execute stage and under
// CUDA-graph capture. The driver entry point is fetched through the runtime, so the extension
// does not link libcuda and still imports on machines without a driver.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "problem.h"

namespace jax_mla {

// 2-D row-major tensor of 16-bit elements: (rows, cols) with `row_stride_elems` between rows,
// read in boxes of (box_rows, box_cols) with the 128-byte swizzle (box_cols * 2 must be 128).
// Returns false (and leaves `map` undefined) if the driver rejects it; `error` says why.
bool make_tensor_map_2d(CUtensorMap* map, const void* base, DType dtype, uint64_t rows, uint64_t cols,
                        uint64_t row_stride_elems, uint32_t box_rows, uint32_t box_cols, const char** error);

// The same (rows, cols) matrix seen as 3-D (64 columns, rows, cols / 64 column boxes), so that one
// copy of box (64, box_rows, boxes) lands `boxes` consecutive column boxes of box_rows rows each,
// in shared memory exactly as that many 2-D copies of (box_rows, 64) would lay them out one after
// the other (dimension 0 fastest, then the rows, then the box index), with the 128-byte swizzle.
// The column-box dimension has the smallest stride (128 bytes): TMA takes dimensions in any
// stride order. Used by benchmarks/tma_bandwidth.cu to measure fewer, larger copies per tile.
bool make_tensor_map_col_boxes(CUtensorMap* map, const void* base, DType dtype, uint64_t rows, uint64_t cols,
                               uint64_t row_stride_elems, uint32_t box_rows, uint32_t boxes, const char** error);

// A 2-D tensor of bytes, (rows, row_bytes) with rows row_bytes apart (a multiple of 16), read in
// boxes of (box_rows, box_bytes) laid out row after row in shared memory, without swizzle (the
// destination must then be 128-byte aligned). The FP8 cache's e4m3 values and scales (SM90, SM100).
bool make_tensor_map_bytes(CUtensorMap* map, const void* base, uint64_t rows, uint64_t row_bytes, uint32_t box_rows,
                           uint32_t box_bytes, const char** error);

}  // namespace jax_mla
