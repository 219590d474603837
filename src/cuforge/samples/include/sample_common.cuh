// Shared by the bundled sample kernels. The demo edits a copy of this header to show an
// explained cache miss: every header a compile reads is part of the cache key.
#pragma once

#ifndef SAMPLE_TILE
#define SAMPLE_TILE 16
#endif

__device__ __forceinline__ int global_index() { return blockIdx.x * blockDim.x + threadIdx.x; }
