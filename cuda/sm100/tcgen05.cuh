// Thin PTX wrappers for the tcgen05 instructions (5th-generation tensor cores, Tensor Memory) the
// SM100 decode kernel uses. Only valid inside code compiled for sm_100a / sm_103a (the kernel body
// is guarded, see decode_kernel.cuh); the descriptor bit layouts are in descriptors.h.
//
// Synchronisation rules this file relies on (PTX ISA, tcgen05 "Memory consistency model"):
//   - tcgen05.mma, tcgen05.commit are asynchronous; a tcgen05.commit from the issuing thread makes an
//     mbarrier track the completion of every earlier asynchronous tcgen05 operation of that thread
//     and arrive once (arrive::one) when they are all done, including their shared-memory reads and
//     their Tensor Memory writes.
//   - tcgen05.ld / tcgen05.st are asynchronous too: registers loaded by tcgen05.ld may only be read
//     after tcgen05.wait::ld, TMEM written by tcgen05.st is only guaranteed written after
//     tcgen05.wait::st.
//   - Across a thread synchronisation (mbarrier arrive/wait, bar.sync), tcgen05 operations are
//     ordered by tcgen05.fence::before_thread_sync on the signalling side and
//     tcgen05.fence::after_thread_sync on the waiting side.
//   - A warp may access only its lane quarter of TMEM with tcgen05.ld/st: warp w, lanes
//     32 * (w % 4) .. 32 * (w % 4) + 31.
#pragma once

#include <cstdint>

namespace jax_mla::sm100::tc {

// ---- allocation (one warp, .sync.aligned: the whole warp executes each of these) ------------------

// Allocates `kCols` TMEM columns (a power of two >= 32) for this CTA and writes the base address
// (lane 0, first column) to `dst` in shared memory. Blocks until the columns are available.
template <int kCols>
__device__ __forceinline__ void alloc(uint32_t* dst) {
  static_assert(kCols >= 32 && kCols <= 512 && (kCols & (kCols - 1)) == 0, "TMEM allocation size");
  asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "n"(kCols)
               : "memory");
}

// This CTA allocates nothing more: lets other CTAs on the SM allocate without waiting on it.
__device__ __forceinline__ void relinquish_alloc_permit() {
  asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");
}

template <int kCols>
__device__ __forceinline__ void dealloc(uint32_t taddr) {
  asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" ::"r"(taddr), "n"(kCols) : "memory");
}

// ---- ordering around thread synchronisation -----------------------------------------------------

__device__ __forceinline__ void fence_before_thread_sync() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}
__device__ __forceinline__ void fence_after_thread_sync() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}

// ---- MMA (issued by one thread) ------------------------------------------------------------------

// D[tmem] (+)= A[smem] * B[smem]^T, weight-stationary variant, kind::f16 (bf16 or fp16 inputs given by
// the instruction descriptor, fp32 accumulation). accumulate == 0 overwrites D.
__device__ __forceinline__ void mma_ws_f16_ss(uint32_t d_tmem, uint64_t a_desc, uint64_t b_desc, uint32_t idesc,
                                              uint32_t accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %4, 0;\n"
      "tcgen05.mma.ws.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n"
      "}\n" ::"r"(d_tmem),
      "l"(a_desc), "l"(b_desc), "r"(idesc), "r"(accumulate)
      : "memory");
}

// The mbarrier at `bar` (this CTA's shared memory) receives one arrival once every tcgen05.mma this
// thread issued so far has completed.
__device__ __forceinline__ void commit(uint64_t* bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
               : "memory");
}

// ---- TMEM <-> registers (warp-collective, .sync.aligned) ----------------------------------------

// Shape 32x32b, 32 repetitions: lane i of the warp reads TMEM lane (lane field of taddr) + i,
// columns [col, col + 32) into v[0..31] (one 32-bit cell per register). The lane field of taddr must
// be the warp's own quarter, 32 * (warp % 4).
__device__ __forceinline__ void ld_32x32b_x32(uint32_t taddr, uint32_t (&v)[32]) {
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];"
      : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]), "=r"(v[4]), "=r"(v[5]), "=r"(v[6]), "=r"(v[7]),
        "=r"(v[8]), "=r"(v[9]), "=r"(v[10]), "=r"(v[11]), "=r"(v[12]), "=r"(v[13]), "=r"(v[14]), "=r"(v[15]),
        "=r"(v[16]), "=r"(v[17]), "=r"(v[18]), "=r"(v[19]), "=r"(v[20]), "=r"(v[21]), "=r"(v[22]), "=r"(v[23]),
        "=r"(v[24]), "=r"(v[25]), "=r"(v[26]), "=r"(v[27]), "=r"(v[28]), "=r"(v[29]), "=r"(v[30]), "=r"(v[31])
      : "r"(taddr)
      : "memory");
}

// The store counterpart of ld_32x32b_x32.
__device__ __forceinline__ void st_32x32b_x32(uint32_t taddr, const uint32_t (&v)[32]) {
  asm volatile(
      "tcgen05.st.sync.aligned.32x32b.x32.b32 [%0], "
      "{%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
      "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32};" ::"r"(taddr),
      "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]), "r"(v[4]), "r"(v[5]), "r"(v[6]), "r"(v[7]), "r"(v[8]),
      "r"(v[9]), "r"(v[10]), "r"(v[11]), "r"(v[12]), "r"(v[13]), "r"(v[14]), "r"(v[15]), "r"(v[16]),
      "r"(v[17]), "r"(v[18]), "r"(v[19]), "r"(v[20]), "r"(v[21]), "r"(v[22]), "r"(v[23]), "r"(v[24]),
      "r"(v[25]), "r"(v[26]), "r"(v[27]), "r"(v[28]), "r"(v[29]), "r"(v[30]), "r"(v[31])
      : "memory");
}

__device__ __forceinline__ void wait_ld() { asm volatile("tcgen05.wait::ld.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wait_st() { asm volatile("tcgen05.wait::st.sync.aligned;" ::: "memory"); }

// The compiler does not know that tcgen05.ld writes its registers only at tcgen05.wait::ld: passing
// them through an empty volatile asm after the wait keeps every use of them after the wait.
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(v[i])::"memory");
}

// Loads 32 columns and waits for them: the common case.
__device__ __forceinline__ void ld_32x32b_x32_sync(uint32_t taddr, uint32_t (&v)[32]) {
  ld_32x32b_x32(taddr, v);
  wait_ld();
  fence_regs(v);
}

}  // namespace jax_mla::sm100::tc
