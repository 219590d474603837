// The classic layout torch's tutorials use: kernels and their torch wrappers in one .cu
// that includes torch's headers. Every kernel edit re-parses torch for the device and
// the host side (~100 s on 2 cores). Compare with ../fast/.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#ifndef SAMPLE_BLOCK
#define SAMPLE_BLOCK 256
#endif

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

__global__ void scale_kernel(const float* x, float alpha, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = alpha * x[i];
}

__global__ void relu_kernel(const float* x, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] > 0.f ? x[i] : 0.f;
}

static unsigned blocks(int64_t n) { return (unsigned)((n + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK); }

torch::Tensor add_cuda(const torch::Tensor& a, const torch::Tensor& b) {
    auto out = torch::empty_like(a);
    auto stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
    add_kernel<<<blocks(a.numel()), SAMPLE_BLOCK, 0, stream>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel());
    return out;
}

torch::Tensor scale_cuda(const torch::Tensor& x, double alpha) {
    auto out = torch::empty_like(x);
    auto stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    scale_kernel<<<blocks(x.numel()), SAMPLE_BLOCK, 0, stream>>>(
        x.data_ptr<float>(), (float)alpha, out.data_ptr<float>(), x.numel());
    return out;
}

torch::Tensor relu_cuda(const torch::Tensor& x) {
    auto out = torch::empty_like(x);
    auto stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    relu_kernel<<<blocks(x.numel()), SAMPLE_BLOCK, 0, stream>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out;
}
