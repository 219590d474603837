// Kernels plus thin C++ launchers. No torch headers: this TU compiles in seconds.
#include "kernels.h"

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

void launch_add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) add_kernel<<<blocks(n), SAMPLE_BLOCK, 0, stream>>>(a, b, out, n);
}

void launch_scale(const float* x, float alpha, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) scale_kernel<<<blocks(n), SAMPLE_BLOCK, 0, stream>>>(x, alpha, out, n);
}

void launch_relu(const float* x, float* out, int64_t n, cudaStream_t stream) {
    if (n > 0) relu_kernel<<<blocks(n), SAMPLE_BLOCK, 0, stream>>>(x, out, n);
}
