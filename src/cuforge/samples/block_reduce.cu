// A templated block reduction built on CUB; instantiate it with a name expression such as
// "block_sum<256, float>". Each block writes the sum of its BLOCK inputs to out[blockIdx.x].
#include <cub/block/block_reduce.cuh>

template <int BLOCK, typename T>
__global__ void block_sum(const T* in, T* out, int n) {
    using Reduce = cub::BlockReduce<T, BLOCK>;
    __shared__ typename Reduce::TempStorage storage;
    int i = blockIdx.x * BLOCK + threadIdx.x;
    T value = i < n ? in[i] : T(0);
    T total = Reduce(storage).Sum(value);
    if (threadIdx.x == 0) out[blockIdx.x] = total;
}
