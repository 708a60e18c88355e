// Python bindings for exllamav3's small-m GEMV (quant/exl3_gemv.cu): the whole EXL3 layer in one cooperative
// launch (input sign flips and Hadamard, trellis decode and product, output Hadamard and sign flips).
// Built by benchmarks/gpu_producer_kernels.py from exllamav3's own sources.
//
// `exl3_gemv` is exllamav3's direct entry point (grid configuration forced by output width). `gemv_as_gemm`
// launches through exl3_gemv_try_launch unforced, as exllamav3's exl3_gemm does for small m: its shape heuristic
// picks the narrow or wide configuration, or declines (then exl3_gemm would run its block kernel, not built
// here); the EXL3_GEMV environment variable it reads (3: narrow, 4: wide) forces one. Returns whether it ran.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "quant/exl3_devctx.cuh"
#include "quant/exl3_gemv.cuh"

static bool gemv_as_gemm(const at::Tensor& a, const at::Tensor& trellis, at::Tensor& c, const at::Tensor& suh,
                         at::Tensor& a_had, const at::Tensor& svh, bool mcg, bool mul1) {
  TORCH_CHECK(a.scalar_type() == at::kHalf && c.scalar_type() == at::kHalf, "a and c: float16");
  TORCH_CHECK(trellis.scalar_type() == at::kShort && trellis.dim() == 3, "trellis: int16 [K/16, N/16, 16 bits]");
  const at::cuda::OptionalCUDAGuard guard(a.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  int size_m = a.numel() / a.size(-1);
  int size_k = a.size(-1);
  int size_n = trellis.size(1) * 16;
  int bits = trellis.size(2) / 16;
  int cb = mul1 ? 2 : mcg ? 1 : 0;
  int device = a.get_device();
  int* locks = DevCtx::instance().get_locks(device);
  const void* a_ptr = a.data_ptr();
  const void* b_ptr = trellis.data_ptr();
  void* c_ptr = c.data_ptr();
  const void* suh_ptr = suh.data_ptr();
  void* had_ptr = a_had.data_ptr();
  const void* svh_ptr = svh.data_ptr();
  void* args[] = {(void*)&a_ptr, (void*)&b_ptr, (void*)&c_ptr, (void*)&size_m, (void*)&size_k, (void*)&size_n,
                  (void*)&locks, (void*)&suh_ptr, (void*)&had_ptr, (void*)&svh_ptr};
  return exl3_gemv_try_launch(args, size_m, size_k, size_n, bits, false, cb, false, true, device, stream, nullptr,
                              false);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("exl3_gemv", &exl3_gemv, "exllamav3's EXL3 GEMV, direct entry point");
  m.def("gemv_as_gemm", &gemv_as_gemm, "exllamav3's EXL3 GEMV as exl3_gemm launches it (heuristic)");
}
