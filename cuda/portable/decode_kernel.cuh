// The portable MLA decode kernel (SM80 and later): the CTA's shared memory and work, then the main
// loop (mainloop.cuh), which every thread runs: the loader (producer.cuh), the tensor-core work
// (mma_tiles.cuh), the online softmax (softmax.cuh) and the epilogue (epilogue.cuh). See config.h
// for the CTA layout and the budgets.
//
// Grid: num_parts * ceil(rows / 32) CTAs, one dimension; CTA x works on part x / m_blocks and query
// rows [32 mb, 32 mb + 32), mb = x % m_blocks, of each request it touches. The row blocks of one
// part are neighbours in launch order, so they run at the same time and read their part's KV
// through L2 once.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "../common/problem.h"
#include "../common/work_iterator.h"
#include "config.h"
#include "mainloop.cuh"

namespace jax_mla::portable {

// kFormat: how the cache stores a row (p.kv_format; config.h for the FP8 stages).
template <typename Element, KvFormat kFormat>
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ DecodeProblem p) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  auto& s = *reinterpret_cast<Storage<Element, kFormat>*>(smem_raw);

  // CTA x: part x / m_blocks, row block x % m_blocks (the row blocks of a part are neighbours).
  const int m_blocks = num_row_blocks(p.rows);
  const int part = blockIdx.x / m_blocks;
  const int m_block = blockIdx.x % m_blocks;
  mainloop<Element, kFormat>(s, p, PartWork(p.schedule, p.num_parts, part, p.seq_lens), m_block);
}

}  // namespace jax_mla::portable
