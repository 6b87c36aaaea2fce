// See device_query.h.
#include "ffi/device_query.h"

#include <cuda_runtime.h>

namespace jax_mla {

int cuda_sm_count() {
  // With the static cudart these calls load libcuda lazily; without a driver they return an
  // error code (cudaErrorInsufficientDriver / cudaErrorNoDevice) instead of failing to load.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    cudaGetLastError();  // reset the last-error state so it does not surface in an unrelated check
    return 0;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms;
}

}  // namespace jax_mla
