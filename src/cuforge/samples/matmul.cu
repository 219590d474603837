// C = A @ B for row-major float matrices (M x K) @ (K x N), tiled through shared memory.
// The tile size is a compile-time constant: compile with defines={"SAMPLE_TILE": 16}.
#include "include/sample_common.cuh"

extern "C" __global__ void matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float a_tile[SAMPLE_TILE][SAMPLE_TILE];
    __shared__ float b_tile[SAMPLE_TILE][SAMPLE_TILE];
    int row = blockIdx.y * SAMPLE_TILE + threadIdx.y;
    int col = blockIdx.x * SAMPLE_TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (K + SAMPLE_TILE - 1) / SAMPLE_TILE; ++t) {
        int ak = t * SAMPLE_TILE + threadIdx.x;
        int bk = t * SAMPLE_TILE + threadIdx.y;
        a_tile[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.0f;
        b_tile[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < SAMPLE_TILE; ++k) acc += a_tile[threadIdx.y][k] * b_tile[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}
