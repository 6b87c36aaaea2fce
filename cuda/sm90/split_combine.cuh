// Split parts (DecodeParams::sm90_split_ctas = k > 1): the k CTAs of a cluster each computed a
// contiguous run of one piece's KV blocks (scheduler.h split_piece) for the same 64 query rows; this
// file merges their k results inside the cluster, through distributed shared memory, into what a
// single CTA would have written for the piece (the final output, or the piece's partial in its
// workspace slot for the combine kernel). So no fp32 partial of a run ever reaches global memory.
//
// Why: at small batches the grid has more SMs than a one-CTA-per-part schedule can feed without
// splitting requests many ways, and every split costs a 64 x 512 fp32 partial written by the decode
// kernel and read back by the combine kernel (b16/1K: ~17 MB each way, as many bytes as the KV
// cache; the combine was a third of the call). Merging inside the cluster keeps those bytes on chip.
//
// Protocol, per piece of the part (n = the piece's index in the part, the same in every CTA of the
// cluster; every CTA takes part, even one whose run of the piece is empty):
//   1. (merge n - 1 ended with every peer done reading this CTA's O: the ring is free);
//   2. both consumers write their normalised O (o / row sum: 64 x 256 fp32 each) into the drained KV
//      ring, XOR-swizzled by 16-byte chunk; consumer 0 writes the rows' natural-log LSE;
//   3. named barrier over the 256 consumer threads, then one thread arrives (release.cluster) on
//      split_ready of every CTA of the cluster; every consumer thread waits on its own split_ready
//      (acquire.cluster), phase n;
//   4. CTA `rank` owns value columns [512 rank / k, 512 (rank + 1) / k): each thread reads its row's k
//      LSEs and its columns' k partial values (k - 1 of them remote), merges them in rank order
//      (combine.h's weights: the same math and NaN rules as the combine kernel, deterministic) and
//      stores the merged slice (rank 0 also the LSE);
//   5. named barrier, then one thread arrives on split_done of every CTA (read complete); every
//      consumer thread waits on its own split_done, phase n (every peer read this CTA's O), and one
//      thread advances split_merges_read to n + 1, which the producer polls before it loads the
//      tiles of piece n + 1 or later into the ring.
// Why a counter for the producer and not split_done's phase: the consumers run through the merges of
// pieces whose run is empty without the producer, so they may be several merges ahead of it, and a
// parity wait cannot tell phase n from phase n - 2. Every wait on split_ready and split_done
// happens at most one phase behind (each needs this CTA's own arrival for the next phase).
// The CTAs exit through a cluster barrier (decode_kernel.cuh), so no CTA's shared memory goes away
// while a peer may still read it.
#pragma once

#include <cmath>
#include <cstdint>

#include "../common/combine.h"
#include "../common/config.h"
#include "../common/params.h"
#include "../common/ptx.cuh"
#include "../common/row_math.cuh"
#include "../common/scheduler.h"
#include "config.h"
#include "softmax.cuh"

namespace jax_mla::sm90 {

inline constexpr int kOChunksPerRow = kHeadDimV / 4;  // 128 chunks of 16 bytes (4 fp32) per row of O

// Byte offset of 16-byte chunk `chunk` of row `row` of the (64, 512) fp32 O in the ring. XOR with
// row % 8 keeps the chunk within its 128-byte group and spreads both access patterns over the banks:
// the fragment stores (8 rows x 2 chunks per warp, 2 wavefronts) and the merge's loads (8 rows x 4
// chunks per warp, 4 wavefronts).
__device__ __forceinline__ uint32_t split_o_offset(int row, int chunk) {
  return static_cast<uint32_t>((row * kOChunksPerRow + (chunk ^ (row & 7))) * 16);
}

template <typename Element, typename Shape>
__device__ __forceinline__ uint32_t split_o_base(SharedStorage<Element, Shape>& s) {
  static_assert(sizeof(s.kv) >= kBlockM * kHeadDimV * sizeof(float), "O (64, 512) fp32 must fit in the KV ring");
  return ptx::smem_addr(&s.kv[0][0]);
}

// Where the merged slice goes: the final output (the piece is the whole request) or its partial slot.
struct SplitDestination {
  int64_t row0;        // first row of the CTA's row block in (b * rows) or (slots * rows)
  int rows_valid;      // rows of the block that exist
  bool final_output;   // num_splits == 1
  bool writes_lse;     // rank 0 writes the LSE
};

// Step 4 for kSplit CTAs: thread `ct` (0..255) of the consumers merges row ct / 4, chunks
// slice0 + ct % 4 + 4 i (i < kChunks / 4) of the rank's slice of kChunks = 128 / kSplit chunks.
template <int kSplit, typename Element, typename Shape>
__device__ __forceinline__ void split_merge_slice(SharedStorage<Element, Shape>& s, const DecodeParams& p, int rank,
                                                  int ct, const SplitDestination& dst) {
  constexpr int kChunks = kOChunksPerRow / kSplit;  // chunks of the slice per row
  constexpr int kPerThread = kChunks / 4;
  static_assert(kChunks % 4 == 0 && kPerThread >= 1);
  const int row = ct >> 2, sub = ct & 3;
  const int slice0 = rank * kChunks;
  const uint32_t o_base = split_o_base(s);
  const uint32_t lse_addr = ptx::smem_addr(&s.split_lse[row]);

  // Issue every load first (k LSEs, then k x kPerThread chunks): one DSMEM latency for all of them.
  float lse[kSplit];
#pragma unroll
  for (int k = 0; k < kSplit; ++k) lse[k] = ptx::ld_shared_cluster_f32(ptx::map_shared_rank(lse_addr, k));
  float4 v[kSplit][kPerThread];
#pragma unroll
  for (int k = 0; k < kSplit; ++k) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const uint32_t local = o_base + split_o_offset(row, slice0 + sub + 4 * i);
      v[k][i] = ptx::ld_shared_cluster_v4(ptx::map_shared_rank(local, k));
    }
  }
  float w[kSplit];
  const float merged_lse = combine_weights(lse, kSplit, 1, w);

  if (row >= dst.rows_valid) return;
  const int64_t out_row = dst.row0 + row;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kSplit; ++k) {  // rank order: the same bits on every run
      acc.x = fmaf(w[k], v[k][i].x, acc.x);
      acc.y = fmaf(w[k], v[k][i].y, acc.y);
      acc.z = fmaf(w[k], v[k][i].z, acc.z);
      acc.w = fmaf(w[k], v[k][i].w, acc.w);
    }
    const int col = (slice0 + sub + 4 * i) * 4;
    if (dst.final_output) {
      Element* out = static_cast<Element*>(p.out) + out_row * kHeadDimV + col;
      *reinterpret_cast<uint2*>(out) = make_uint2(pack2<Element>(acc.x, acc.y), pack2<Element>(acc.z, acc.w));
    } else {
      *reinterpret_cast<float4*>(p.partial_out + out_row * kHeadDimV + col) = acc;
    }
  }
  if (dst.writes_lse && sub == 0) (dst.final_output ? p.lse : p.partial_lse)[out_row] = merged_lse;
}

// The whole protocol above for one piece, run by both consumers (256 threads). o: this consumer's
// (64, 256) fragment of columns [col0, col0 + 256), unnormalised; res: its rows' 1 / sum and LSE
// (for a CTA whose run of the piece is empty: o = 0, inv_sum = 0, lse = -inf). index: the piece's
// index n in the part.
template <typename Element, typename Shape>
__device__ __forceinline__ void split_merge(SharedStorage<Element, Shape>& s, const DecodeParams& p,
                                            const float (&o)[128], const RowResult& res, const RowCoords& rc,
                                            int consumer, int index, int rank, int count,
                                            const SplitDestination& dst) {
  const int thread = threadIdx.x % 128;
  const int ct = consumer * 128 + thread;
  const bool elected = ct == 0;
  // 2. Publish the normalised O and the LSE.
  const uint32_t o_base = split_o_base(s);
  const int col0 = consumer * kColsPerConsumer;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = rc.row[i];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = col0 + 8 * j + rc.quad_col;  // fragment columns col, col + 1
      const uint32_t addr = o_base + split_o_offset(row, col / 4) + (col % 4) * 4;
      const float v0 = o[4 * j + 2 * i] * res.inv_sum[i];
      const float v1 = o[4 * j + 2 * i + 1] * res.inv_sum[i];
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v0), "f"(v1) : "memory");
    }
    if (consumer == 0 && (thread & 3) == 0) s.split_lse[row] = res.lse[i];
  }
  // 3. Every CTA's O is published.
  ptx::named_barrier_sync(kBarSplit, kConsumerThreads);
  if (elected) {
    for (int r = 0; r < count; ++r) ptx::mbarrier_arrive_release_cluster(&s.split_ready, r);
  }
  ptx::mbarrier_wait_cluster(&s.split_ready, index & 1);
  // 4. Merge this CTA's slice of the columns.
  switch (count) {
    case 2: split_merge_slice<2>(s, p, rank, ct, dst); break;
    case 4: split_merge_slice<4>(s, p, rank, ct, dst); break;
    default: split_merge_slice<8>(s, p, rank, ct, dst); break;
  }
  // 5. This CTA has read every peer's O: they may reuse their rings. The proxy fence orders this
  // thread's generic accesses to the ring before the producers' next TMA writes into it.
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(kBarSplit, kConsumerThreads);
  if (elected) {
    for (int r = 0; r < count; ++r) ptx::mbarrier_arrive_release_cluster(&s.split_done, r);
  }
  ptx::mbarrier_wait_cluster(&s.split_done, index & 1);
  if (elected) ptx::st_release_shared(&s.split_merges_read, index + 1);
}

}  // namespace jax_mla::sm90
