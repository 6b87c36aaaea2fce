// PTX wrappers of the portable kernel: warp-level tensor-core MMA, ldmatrix and cp.async, all
// available from SM80 on (no TMA, mbarrier or wgmma, so the same code runs on every later GPU).
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4), each register two 16-bit values:
//   A (16 x 16, row major): a0 = (row g,     cols 2t, 2t+1)   a1 = (row g + 8, cols 2t, 2t+1)
//                           a2 = (row g,     cols 2t+8, 2t+9) a3 = (row g + 8, cols 2t+8, 2t+9)
//   B (16 x 8, "col"):      b0 = (rows 2t, 2t+1, col g)       b1 = (rows 2t+8, 2t+9, col g)
//   C (16 x 8, fp32):       c0, c1 = (row g, cols 2t, 2t+1)   c2, c3 = (row g + 8, cols 2t, 2t+1)
// ldmatrix x4 loads four 8 x 8 matrices whose rows' addresses come from lanes 0-7, 8-15, 16-23 and
// 24-31; register i holds matrix i with lane l at (row l / 4, cols 2 (l % 4), +1), or, with .trans,
// at (rows 2 (l % 4), +1, col l / 4) -- the B fragment of a matrix stored row = k.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

namespace jax_mla::portable {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// c += a b, (16 x 16) x (16 x 8), fp32 accumulators.
template <typename Element>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<Element, __half>, "bf16 or fp16 only");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The memory clobbers keep the shared-memory reads below the barriers that publish the data.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// 16 bytes global -> shared, bypassing L1 (the cache is streamed once). With valid = false nothing
// is read and the 16 bytes are zero-filled (src-size 0): tokens past seq_len and pages the block
// table does not name never touch memory, so whatever they hold (NaN, garbage) cannot reach O.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `kPending` of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace jax_mla::portable
