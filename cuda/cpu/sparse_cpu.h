// The CPU sparse decode kernel (DeepSeek-V3.2 DSA): each query token attends to its own list of
// selected cache slots instead of a request's prefix. The "cpu" platform implementation of the
// jax_mla_decode_sparse FFI target (ffi/cpu_sparse_handler.cc).
#pragma once

#include <cstdint>

#include "common/sparse_problem.h"

namespace jax_mla {

// Row (r, t, h): softmax over the selected slots of indices[r, t, :n], n = sparse_count(p, r)
// (common/sparse_problem.h), skipping -1; a slot listed twice counts twice. out is
// the probabilities times the slots' first 512 columns, lse the natural log-sum-exp of the scaled
// scores; with no valid slot out = 0 and lse = -inf. With attn_sink, out is then divided by
// attn_sink_divisor(attn_sink[h], lse) (lse unchanged).
// Precondition (the handler checks it): every counted index is -1 or in [0, num_slots).
void decode_sparse_cpu(const SparseProblem& p, bool baseline_gemm = false, int max_threads = 0);

}  // namespace jax_mla
