// One check macro for every CUDA-side library status: the CUDA runtime (cudaError_t), cuBLAS and
// cuBLASLt (cublasStatus_t), and -- when their headers are included before this one -- cuDNN,
// NCCL and NVML. A failure throws anatomy::Error naming the statement, the library's own words
// and file:line. ANATOMY_CUDA_LAUNCH_CHECK() goes after every kernel launch: launches return no
// status, so configuration errors (too many threads, too much shared memory) surface only
// through cudaGetLastError.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace anatomy::cuda {

inline void check_status(cudaError_t s, const char* stmt, const char* file, int line) {
  if (s != cudaSuccess)
    fail("CUDA error ", cudaGetErrorName(s), " (", cudaGetErrorString(s), ") in ", stmt, " at ", file,
         ":", line);
}

inline void check_status(cublasStatus_t s, const char* stmt, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS error ", cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ") in ", stmt,
         " at ", file, ":", line);
}

#if defined(CUDNN_MAJOR)
inline void check_status(cudnnStatus_t s, const char* stmt, const char* file, int line) {
  if (s != CUDNN_STATUS_SUCCESS)
    fail("cuDNN error ", cudnnGetErrorString(s), " in ", stmt, " at ", file, ":", line);
}
#endif

#if defined(NCCL_MAJOR)
inline void check_status(ncclResult_t s, const char* stmt, const char* file, int line) {
  if (s != ncclSuccess) fail("NCCL error ", ncclGetErrorString(s), " in ", stmt, " at ", file, ":", line);
}
#endif

#if defined(NVML_API_VERSION)
inline void check_status(nvmlReturn_t s, const char* stmt, const char* file, int line) {
  if (s != NVML_SUCCESS) fail("NVML error ", nvmlErrorString(s), " in ", stmt, " at ", file, ":", line);
}
#endif

}  // namespace anatomy::cuda

#define ANATOMY_CUDA_CHECK(stmt) ::anatomy::cuda::check_status((stmt), #stmt, __FILE__, __LINE__)

// After each <<<...>>>: reports invalid launch configurations (and earlier asynchronous errors).
#define ANATOMY_CUDA_LAUNCH_CHECK() \
  ::anatomy::cuda::check_status(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
