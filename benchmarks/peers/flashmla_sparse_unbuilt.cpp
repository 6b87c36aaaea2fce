// FlashMLA's sparse-decode dispatch (csrc/api/sparse_decode.h) names, besides the SM90 V3.2 kernels
// the benchmark builds (v32_persistent_h64.cu, v32_persistent_h128.cu), the SM90 MODEL1 kernels
// (d_qk 512: DISPATCH_MODEL_TYPE instantiates both model types) and the SM100 ones. These definitions
// stand in for those, so that the module links and a call that reached one (an SM100 GPU, or
// d_qk = 512) fails loudly instead of running something else.
#include <stdexcept>

#include "params.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "sm100/decode/head64/kernel.h"
#include "sm100/prefill/sparse/fwd_for_small_topk/head128/phase1.h"

#define FLASHMLA_UNBUILT(WHAT) \
  throw std::runtime_error("FlashMLA's " WHAT " sparse decode is not built for jax-mla's benchmark")

namespace sm90::decode::sparse_fp8 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 64>(const SparseAttnDecodeParams &) {
  FLASHMLA_UNBUILT("SM90 MODEL1 h64");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 128>(const SparseAttnDecodeParams &) {
  FLASHMLA_UNBUILT("SM90 MODEL1 h128");
}
}  // namespace sm90::decode::sparse_fp8

namespace sm100::decode::head64 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32>(const SparseAttnDecodeParams &) {
  FLASHMLA_UNBUILT("SM100 V3.2 head64");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1>(const SparseAttnDecodeParams &) {
  FLASHMLA_UNBUILT("SM100 MODEL1 head64");
}
}  // namespace sm100::decode::head64

namespace sm100::fwd_for_small_topk::head128 {
template <>
void run_fwd_for_small_topk_phase1_kernel<SparseAttnFwdMode::DecodeWithSplitKV, 512>(const SparseAttnDecodeParams &) {
  FLASHMLA_UNBUILT("SM100 head128");
}
}  // namespace sm100::fwd_for_small_topk::head128
