// The torch side of the fast-edit layout: tensor checks, the current stream, and the
// Python / TORCH_LIBRARY registrations. Compiled once by the host compiler and then
// served from cuforge's object cache while the kernels in kernels.cu are edited.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels.h"

namespace {

void check(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32");
    TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
}

cudaStream_t stream_of(const torch::Tensor& t) {
    return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace

torch::Tensor add(const torch::Tensor& a, const torch::Tensor& b) {
    check(a, "a");
    check(b, "b");
    TORCH_CHECK(a.sizes() == b.sizes(), "a and b must have the same shape");
    if (!a.is_cuda()) return a + b;
    auto out = torch::empty_like(a);
    launch_add(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel(),
               stream_of(a));
    return out;
}

torch::Tensor scale(const torch::Tensor& x, double alpha) {
    check(x, "x");
    if (!x.is_cuda()) return x * alpha;
    auto out = torch::empty_like(x);
    launch_scale(x.data_ptr<float>(), (float)alpha, out.data_ptr<float>(), x.numel(),
                 stream_of(x));
    return out;
}

torch::Tensor relu(const torch::Tensor& x) {
    check(x, "x");
    if (!x.is_cuda()) return torch::relu(x);
    auto out = torch::empty_like(x);
    launch_relu(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(), stream_of(x));
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("add", &add, "a + b");
    m.def("scale", &scale, "alpha * x");
    m.def("relu", &relu, "max(x, 0)");
}

// The same ops for torch.ops (load with is_python_module=False).
TORCH_LIBRARY(cuforge_sample, m) {
    m.def("add(Tensor a, Tensor b) -> Tensor");
    m.def("scale(Tensor x, float alpha) -> Tensor");
    m.def("relu(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(cuforge_sample, CPU, m) {
    m.impl("add", &add);
    m.impl("scale", &scale);
    m.impl("relu", &relu);
}

TORCH_LIBRARY_IMPL(cuforge_sample, CUDA, m) {
    m.impl("add", &add);
    m.impl("scale", &scale);
    m.impl("relu", &relu);
}
