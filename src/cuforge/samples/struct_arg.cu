// A kernel that takes a struct by value: out[i] = in[i] * p.scale + p.shift + p.bias.
// From Python pass a numpy structured scalar, bytes, or a ctypes.Structure of 24 bytes.
struct Affine {
    float scale;
    float shift;
    int n;
    double bias;  // at offset 16: the struct is 24 bytes, 8-aligned
};

extern "C" __global__ void affine(float* out, const float* in, Affine p) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) out[i] = in[i] * p.scale + p.shift + (float)p.bias;
}
