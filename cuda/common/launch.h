// Host-side launchers of the kernels shared by every GPU architecture: the split-KV scheduler and
// the combine. Architecture-specific decode launchers live in sm90/, sm100/, portable/.
// Those kernels are compiled for every architecture of the build (sm_80 and later), so their
// programmatic-dependent-launch instructions are guarded (ptx.cuh).
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "problem.h"
#include "scheduler.h"

namespace jax_mla {

// Launch configuration with programmatic dependent launch (PDL, SM90 and later): the kernel may
// start while the previous kernel on the stream finishes; it must call ptx::grid_dependency_wait()
// before reading that kernel's results. With programmatic = false the launch is in plain stream
// order (no attribute): what the portable path uses, since its code may come from a cubin or PTX
// compiled without griddepcontrol. `attr` must outlive the launch call.
inline cudaLaunchConfig_t pdl_launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                            cudaLaunchAttribute* attr, bool programmatic = true) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr->val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = programmatic ? attr : nullptr;
  cfg.numAttrs = programmatic ? 1 : 0;
  return cfg;
}

// One-time per-device setup (opt-in shared memory); call outside the execute path.
cudaError_t setup_schedule_kernel();

// schedule: (schedule_size(batch, num_parts, chunks.invariant())) int32, written on the device;
// zeroed: (num_zeroed) int32 set to 0 by the same kernel (the SM90 fused merge's counters), or
// nullptr; chunks: the batch-invariant plan's parameters, {0, 0} for the default plans.
cudaError_t launch_schedule(const int32_t* seq_lens, int batch, int num_parts, int32_t* schedule, cudaStream_t stream,
                            int32_t* zeroed = nullptr, int num_zeroed = 0, ChunkSpec chunks = {0, 0});

// Merges the partials of requests split over several parts into p.out / p.lse, and writes the
// empty-request results (out 0, lse -inf), for the requests p.schedule's combine list names.
// Launched right after the decode kernel as a persistent grid of at most sm_count * (CTAs per SM)
// CTAs (sm_count <= 0: 132), with programmatic dependent launch when `programmatic` (the SM90 /
// SM100 paths), else in stream order.
cudaError_t launch_combine(const DecodeProblem& p, int sm_count, bool programmatic, cudaStream_t stream);

}  // namespace jax_mla
