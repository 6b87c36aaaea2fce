// Thin wrappers over the PTX instructions the SM90 and SM100 decode kernels share:
// mbarriers, bulk tensor copies (TMA), proxy fences, named barriers, programmatic dependent
// launch (also used by the shared scheduler and combine kernels, which run on every architecture). Raw PTX rather than CuTe: the decode kernels need exactly these few instructions,
// and spelling them out keeps each one's semantics visible where it is used.
#pragma once

#include <cstdint>
#include <cuda.h>  // CUtensorMap

namespace jax_mla::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The first kAlign-aligned byte of a dynamic shared-memory buffer. Pointer arithmetic on the
// __shared__ array itself (not a round trip through an integer) keeps its state space visible to
// the compiler, which then accesses the buffer with LDS/STS instead of generic loads and stores.
template <uint32_t kAlign>
__device__ __forceinline__ uint8_t* align_dynamic_smem(uint8_t* base) {
  static_assert((kAlign & (kAlign - 1)) == 0, "power of two");
  return base + ((kAlign - (smem_addr(base) & (kAlign - 1))) & (kAlign - 1));
}

// ---- mbarrier -------------------------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrive_count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrive_count));
}

// Makes mbarrier.init visible to the async proxy (TMA completes transactions on these barriers).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` of transactions (TMA) still to land on this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// cp.async (16 bytes, L2 only) of global src into shared dst; src_bytes 0 zero-fills dst without
// reading src (a token that is not there).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}

// cp_async_16 issued only where `pred` holds, as one predicated instruction (no branch: a warp whose
// lanes differ in pred does not diverge). dst: a shared-memory address (smem_addr).
__device__ __forceinline__ void cp_async_16_if(bool pred, uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %0, 0;\n @p cp.async.cg.shared.global [%1], [%2], 16, %3;\n}" ::"r"(
          static_cast<uint32_t>(pred)),
      "r"(dst), "l"(src), "r"(src_bytes)
      : "memory");
}

// An arrival on bar once every cp.async this thread issued before has landed; .noinc: the barrier's
// expected count must include one such arrival per thread.
__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Blocks until the phase with parity `phase` of the barrier has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}

// Non-blocking: whether the phase with parity `phase` of the barrier has completed (acquire when it
// has). Lets a thread pick the order of two pieces of work by what is ready (SM100 MMA warp).
__device__ __forceinline__ bool mbarrier_test_wait(uint64_t* bar, uint32_t phase) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(phase)
      : "memory");
  return done != 0;
}

// One bounded attempt: suspends until the phase with parity `phase` completes or a system-dependent
// time limit passes; whether it completed (acquire when it has). For waits that must look at a
// clock between attempts (common/watchdog.cuh).
__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* bar, uint32_t phase) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(phase)
      : "memory");
  return done != 0;
}

// ---- TMA ------------------------------------------------------------------------------------

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// 2-D tiled bulk tensor copy global -> shared; completes `bytes` on `bar`. Out-of-bounds
// elements are filled with zeros and still count towards the transaction bytes.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(col), "r"(row)
      : "memory");
}

// 3-D tiled bulk tensor copy global -> shared (coordinates innermost first); as tma_load_2d.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// ---- fences and barriers --------------------------------------------------------------------

// Orders this thread's ordinary shared-memory writes before later async-proxy accesses
// (wgmma / tcgen05 operand reads, TMA writes) to the same memory.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Named barrier among `num_threads` threads (a multiple of 32). Id 0 is __syncthreads.
__device__ __forceinline__ void named_barrier_sync(int id, int num_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

// Arrives at a named barrier without waiting for it: the producer side of a producer/consumer
// hand-off between thread groups (the consumers bar.sync on the same id and count).
__device__ __forceinline__ void named_barrier_arrive(int id, int num_threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

// ---- grid-scope flags (the SM90 kernel's in-kernel split merge) -------------------------------

// Adds v to a global counter with release semantics at GPU scope: every write this thread has
// observed (its own, and by bar.sync those of the threads it synchronised with) is visible to a
// thread that reads the new value with ld_acquire_gpu.
__device__ __forceinline__ void red_release_gpu_add(int* addr, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ int ld_acquire_gpu(const int* addr) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

// Nanoseconds of the GPU's global timer (a progress bound for spin waits).
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// ---- programmatic dependent launch ------------------------------------------------------------

// Waits until the preceding grid (launched before this one on the stream) has completed and its
// memory is visible. A no-op when the kernel was launched without the PDL attribute.
// PDL exists from SM90 on. Code compiled for older architectures (the shared kernels' sm_80 cubin
// and compute_80 PTX) has no griddepcontrol; the handlers launch it in plain stream order
// (programmatic = false in launch.h), where the wait has nothing to wait for.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next grid on the stream start launching (it still waits in grid_dependency_wait).
__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- register budget (sm_90a and later) -------------------------------------------------------

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace jax_mla::ptx
