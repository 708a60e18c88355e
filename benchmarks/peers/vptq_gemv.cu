// VPTQ's own small-batch GEMV kernel (microsoft/VPTQ, csrc/kernels/quant_gemv.cuh), launched for the
// configurations qlinear benchmarks: 16-bit main codes over vectors of 8, no residual or an 8-bit one,
// float16, no outliers. VPTQ's host function dispatches over about a thousand template instances (every
// code width, residual width, vector length and dtype); compiling those takes far longer than a device
// session allows, so this file launches the two instances the benchmark needs with VPTQ's own grid
// (one block of 256 threads per 8 output rows per row of x, four column strides of 256 a block along K)
// and sums the per-segment partials as its host code does. Built by benchmarks/gpu_producer_kernels.py.
#include <torch/extension.h>

#include "kernels/quant_gemv.cuh"
#include "util/common.h"

namespace {

constexpr int kVector = 8;
constexpr int kReduce = 4;

template <int RES_BITS>
void launch(torch::Tensor& part, const torch::Tensor& x, const torch::Tensor& indices,
            const torch::Tensor& centroids, const torch::Tensor* res, const torch::Tensor& perm,
            const torch::Tensor& scale, const torch::Tensor& bias, int out_features, dim3 grid) {
  const int in_features = x.size(-1);
  auto stream = at::cuda::getCurrentCUDAStream().stream();
  vptq::kernels::WqA16WithOutliers_PackIndice<__half, 16, RES_BITS, kVector, 4, kReduce>
      <<<grid, vptq::cuda::kBlockSize, 0, stream>>>(
          reinterpret_cast<__half*>(part.data_ptr()),
          reinterpret_cast<const __half*>(x.data_ptr()), indices.data_ptr<int32_t>(), nullptr,
          reinterpret_cast<const __half*>(centroids.data_ptr()),
          res ? reinterpret_cast<const __half*>(res->data_ptr()) : nullptr, nullptr,
          reinterpret_cast<const uint16_t*>(perm.data_ptr<int16_t>()),
          reinterpret_cast<const __half*>(scale.data_ptr()),
          reinterpret_cast<const __half*>(bias.data_ptr()), nullptr, out_features, in_features, 0,
          indices.stride(0), indices.stride(1), centroids.stride(0), indices.size(0));
}

}  // namespace

// x [M, K] float16; indices [G, N/8, words] int32; centroids [G, 65536, 8] float16; res_centroids
// [G, 256, 8] or None; perm [K] int16; weight_scale, weight_bias [K] float16. Returns [M, N] float16.
torch::Tensor gemv(const torch::Tensor& x, const torch::Tensor& indices, const torch::Tensor& centroids,
                   const c10::optional<torch::Tensor>& res_centroids, const torch::Tensor& perm,
                   const torch::Tensor& weight_scale, const torch::Tensor& weight_bias, int64_t out_features) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == at::kHalf, "x: contiguous CUDA float16");
  TORCH_CHECK(centroids.scalar_type() == at::kHalf && centroids.dim() == 3 && centroids.size(1) == 65536 &&
                  centroids.size(2) == kVector,
              "centroids: float16 [G, 65536, 8]");
  TORCH_CHECK(indices.scalar_type() == at::kInt && indices.is_contiguous(), "indices: contiguous int32");
  const int in_features = x.size(-1);
  const int rows = x.numel() / in_features;
  TORCH_CHECK(in_features > vptq::cuda::kBlockSize, "K must exceed 256 (VPTQ's kernel)");
  const int segments = (in_features + vptq::cuda::kBlockSize * kReduce - 1) / (vptq::cuda::kBlockSize * kReduce);
  auto part = at::empty({rows, out_features, segments}, centroids.options());
  dim3 grid((out_features + kVector - 1) / kVector, rows, segments);
  const int res_bits = res_centroids.has_value() ? 31 - __builtin_clz((unsigned) res_centroids->size(1)) : 0;
  if (res_bits == 0) {
    launch<0>(part, x, indices, centroids, nullptr, perm, weight_scale, weight_bias, out_features, grid);
  } else {
    TORCH_CHECK(res_bits == 8, "residual codebook: 256 entries, got ", res_centroids->size(1));
    launch<8>(part, x, indices, centroids, &*res_centroids, perm, weight_scale, weight_bias, out_features,
              grid);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return part.sum(-1);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gemv", &gemv, "VPTQ's WqA16WithOutliers_PackIndice GEMV"); }
