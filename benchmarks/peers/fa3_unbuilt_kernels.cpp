// FlashAttention-3's dispatch (hopper/flash_api_stable.cpp) names a forward kernel for every head
// dimension its build keeps. The benchmark builds only the hdim 64 / hdim_v 512 bf16 kernels (the
// MLA decode: q = the 64 RoPE columns, qv = the 512 latent columns); keeping hdim 64 also names the
// 64/64 and 64/256 kernels. These definitions stand in for those two, so that the module links and
// a call that reached one would fail loudly instead of running something else.
#include <stdexcept>

#include <cutlass/numeric_types.h>

#include "flash.h"

// The five (Split, PagedKVNonTMA, PackGQA) combinations the dispatch can reach for one head
// dimension (PackGQA is forced on with Split or PagedKVNonTMA); softcap is compiled out.
#define FA3_UNBUILT(DV, SPLIT, PAGED_NON_TMA, PACK_GQA)                                                      \
  template <>                                                                                               \
  void run_mha_fwd_<90, cutlass::bfloat16_t, 64, DV, SPLIT, PAGED_NON_TMA, false, PACK_GQA>(Flash_fwd_params &, \
                                                                                        cudaStream_t) {     \
    throw std::runtime_error("FlashAttention-3 hdim 64/" #DV " is not built for jax-mla's benchmark");     \
  }
#define FA3_UNBUILT_ALL(DV)             \
  FA3_UNBUILT(DV, false, false, false)  \
  FA3_UNBUILT(DV, false, false, true)   \
  FA3_UNBUILT(DV, false, true, true)    \
  FA3_UNBUILT(DV, true, false, true)    \
  FA3_UNBUILT(DV, true, true, true)

FA3_UNBUILT_ALL(64)
FA3_UNBUILT_ALL(256)
