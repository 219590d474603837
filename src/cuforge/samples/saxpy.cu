// y = a * x + y: a plain extern "C" kernel (float and half variants).
#include <cuda_fp16.h>
#include "include/sample_common.cuh"

extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = global_index();
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void saxpy_half(__half* y, const __half* x, float a, int n) {
    int i = global_index();
    if (i < n) y[i] = __float2half(a * __half2float(x[i]) + __half2float(y[i]));
}
