// cuforge's custom-op shim (see cuforge/torch/opshim.py): registers, for a kernel-mode
// custom op, a boxed C++ kernel with torch's dispatcher for the CUDA key. The kernel reads
// the op's arguments from the IValue stack, allocates the outputs, packs the kernel's
// parameter buffer and calls the driver's cuLaunchKernelEx (or cuLaunchKernel) on torch's
// current stream -- no Python on the way (issue 25: ~6 us less per call than the Python
// kernel). Built once per torch version by cuforge's own torch build and cached.
//
// It needs only torch's CPU headers: the driver's launch entry point and torch's
// aoti_torch_get_current_cuda_stream come in as addresses, so the shim compiles against a
// CPU-only torch and links against no CUDA library. A plain C API (ctypes); the eager entry
// below uses torch's Python headers (THPVariable, HANDLE_TH_ERRORS) and the CPython API.
//
// The eager entry (cfshim_fast): a METH_FASTCALL builtin per op that the op's __call__
// calls outside torch.compile. When nothing would change what the dispatcher does with the
// call -- plain torch.Tensor arguments (no subclass, no functionalization / batching /
// conj / neg key), no dispatch or torch-function mode, no TLS-included key beyond torch's
// defaults (BackendSelect, ADInplaceOrView), no input
// that needs grad, no RecordFunction callback (the profiler) -- it runs the same kernel
// as the dispatcher would, skipping torch's Python -> IValue -> dispatcher hop (~2.5 us);
// otherwise it calls the op's OpOverload, so every other path is torch's own.
//
// cfshim_py_entry: the same entry for an op whose device kernel stays Python (a lambda grid,
// a launcher): the same checks, then that Python kernel called with the call's own
// arguments, skipping the round trip through the dispatcher back into Python.
#include <Python.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// Messages are built from strings and std::to_string, never through an ostream (c10::str,
// TORCH_CHECK with arguments). On the H200 host (torch 2.11.0+cu130, g++ 13.3), formatting
// an integer through an ostream made in this library crashed the process: cuda-gdb showed
// std::basic_ostream::_M_insert<long> and then a locale facet's virtual call
// (codecvt<char16_t>::do_unshift, a wrong slot) resolved inside the shim itself, so the
// ostream's num_put facet came from a facet id torch's libstdc++ locale does not hold.
// to_string formats through snprintf: no locale facet. (Strings alone never reached a
// facet: the not-contiguous message always worked.)
inline void put(std::string& s, const std::string& v) { s += v; }
inline void put(std::string& s, const char* v) { s += v; }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
inline void put(std::string& s, T v) {
  s += std::to_string(v);
}
template <typename... A>
std::string cat(const A&... a) {
  std::string s;
  (put(s, a), ...);
  return s;
}

// cfshim_register's checks: a plain exception its own catch turns into the error text
inline void need(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

enum { K_PTR = 0, K_F32, K_F64, K_F16, K_I8, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_U64 };
enum { A_TENSOR = 0, A_INT, A_FLOAT, A_BOOL };
constexpr int MAXDEV = 64;
constexpr int MAXP = 64;
constexpr int MAXBUF = 4096;

struct LaunchConfig {  // CUlaunchConfig, no attributes
  unsigned gx, gy, gz, bx, by, bz, shmem;
  void* stream;
  void* attrs;
  unsigned nattrs;
};
using launch_ex_t = int (*)(const LaunchConfig*, void*, void**, void**);
using launch_t = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);
using stream_t = int32_t (*)(int32_t, void**);
using prepare_t = uint64_t (*)(int32_t);

struct Param {
  int src;  // >= 0: op input index; < 0: output -(src + 1)
  int kind;
  int64_t offset;
  int dtype;  // c10::ScalarType code, -1: any
};

struct Input {
  int type;
  bool readonly;  // made contiguous when it is not
  bool mutated;   // version counter bumped
  // the dtypes the kernel's parameters need of this tensor: (parameter index, ScalarType
  // code) for each pointer parameter it is passed as, and for each output shaped like it
  // (an output is allocated with its model's dtype). Checked in phase 1, with the rest of
  // the input's checks.
  std::vector<std::pair<int, int>> dtypes;
};

// torch's name of a c10::ScalarType code (the codes are stable: torch's C shim
// aoti_torch_dtype_* returns them). Not operator<<(ScalarType): the kernel's messages use
// nothing of torch but the tensor's own fields.
const char* dtype_name(int code) {
  static const char* const names[] = {
      "torch.uint8",     "torch.int8",      "torch.int16",      "torch.int32",
      "torch.int64",     "torch.float16",   "torch.float32",    "torch.float64",
      "torch.complex32", "torch.complex64", "torch.complex128", "torch.bool",
      "torch.qint8",     "torch.quint8",    "torch.qint32",     "torch.bfloat16"};
  return code >= 0 && code < 16 ? names[code] : "another dtype";
}

struct Plan {
  std::string label;
  int n_in = 0, n_out = 0, buf_size = 0;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, shmem = 0;
  int grid_mode = 0, grid_src = -1;
  int64_t grid_per = 1;
  bool grad_check = false;
  bool cpu = false;  // tests only: registered for the CPU key, launches to a recording stand-in
  std::vector<Param> params;
  std::vector<Input> inputs;
  std::vector<int> types;  // inputs[i].type, for plain_call
  std::vector<int> out_like;
  std::vector<std::string> input_names;
  launch_ex_t launch_ex = nullptr;
  launch_t launch = nullptr;
  stream_t stream = nullptr;
  prepare_t prepare = nullptr;
  std::atomic<uint64_t> funcs[MAXDEV];
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> fast_calls{0};  // of calls: the ones the eager entry took itself
};

int launch(const Plan& p, const unsigned* g, uint64_t func, void* stream, void** ptrs) {
  if (p.launch_ex != nullptr) {
    LaunchConfig lc{g[0], g[1], g[2], p.block[0], p.block[1], p.block[2], p.shmem,
                    stream, nullptr, 0};
    return p.launch_ex(&lc, reinterpret_cast<void*>(func), ptrs, nullptr);
  }
  return p.launch(reinterpret_cast<void*>(func), g[0], g[1], g[2], p.block[0], p.block[1],
                  p.block[2], p.shmem, stream, ptrs, nullptr);
}

// Errors: the kernel's own checks never throw from a frame that holds a CUDA tensor, a
// contiguous() copy or a device guard. run() validates everything it can before it allocates
// -- each tensor input in one loop (device, grad, contiguity of written tensors, every dtype
// the kernel's pointer parameters and the outputs shaped like it need), then the scalars'
// ranges and the grid -- returns false with the message on a failed check, and operator()
// throws only after run()'s frame is gone (tensors freed, the device restored): the unwinding
// crosses no CUDA state. After phase 1 only the driver can refuse (loading, stream, launch).
struct Kernel final : c10::OperatorKernel {
  explicit Kernel(std::shared_ptr<Plan> p) : plan(std::move(p)) {}
  std::shared_ptr<Plan> plan;

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    std::string err;
    if (!run(*plan, *stack, err)) TORCH_CHECK(false, err);
  }

  static bool run(Plan& p, torch::jit::Stack& stack, std::string& err) {
    if (stack.size() < static_cast<size_t>(p.n_in)) {
      err = cat(p.label, ": the stack holds fewer values than the op's inputs");
      return false;
    }
    const size_t base = stack.size() - p.n_in;
    at::Tensor tensors[MAXP];  // the inputs, read-only ones made contiguous (phase 2)
    int device = -1;
    // phase 1: checks only, nothing allocated; every tensor check here, per input
    for (int i = 0; i < p.n_in; i++) {
      if (p.inputs[i].type != A_TENSOR) continue;
      const at::Tensor& t = stack[base + i].toTensor();
      if (!p.cpu && !t.is_cuda()) {
        err = cat(p.label, ": argument '", p.input_names[i], "' is on ",
                  c10::DeviceTypeName(t.device().type(), /*lower_case=*/true),
                  ", not a CUDA device");
        return false;
      }
      const int dev = p.cpu ? 0 : t.get_device();
      if (device < 0) device = dev;
      if (dev != device) {
        err = cat(p.label, ": argument '", p.input_names[i], "' is on cuda:", dev,
                  " but an earlier tensor is on cuda:", device);
        return false;
      }
      if (p.grad_check && t.requires_grad() && c10::GradMode::is_enabled()) {
        err = cat("custom op ", p.label, ": argument '", p.input_names[i],
                  "' requires grad but the op has no autograd formula; register one with "
                  "op.register_autograd(backward, setup_context=...), or call it under "
                  "torch.no_grad() / on .detach()ed tensors");
        return false;
      }
      if (!p.inputs[i].readonly && !t.is_contiguous()) {
        err = cat(p.label, ": argument '", p.input_names[i],
                  "' is written by the kernel but is not contiguous");
        return false;
      }
      const int have = static_cast<int>(t.scalar_type());
      for (const auto& want : p.inputs[i].dtypes) {
        if (have != want.second) {
          err = cat(p.label, ": argument '", p.input_names[i], "' is ", dtype_name(have),
                    " (code ", have, ") but kernel parameter ", want.first,
                    " expects another dtype: ", dtype_name(want.second), " (code ",
                    want.second, ")");
          return false;
        }
      }
    }
    if (device < 0 || device >= MAXDEV) {
      err = cat(p.label, ": no CUDA tensor argument");
      return false;
    }
    alignas(16) char buf[MAXBUF];
    void* ptrs[MAXP];
    int64_t grid_value = -1;
    for (size_t k = 0; k < p.params.size(); k++) {
      const Param& q = p.params[k];
      char* slot = buf + q.offset;
      ptrs[k] = slot;
      if (q.kind == K_PTR) {  // packed in phase 2; its dtype was checked with its input
        if (p.grid_mode == 1 && p.grid_src == static_cast<int>(k)) {
          const int src = q.src >= 0 ? q.src : p.out_like[-(q.src + 1)];
          grid_value = stack[base + src].toTensor().numel();
        }
        continue;
      }
      const c10::IValue& v = stack[base + q.src];
      if (q.kind == K_F32 || q.kind == K_F64 || q.kind == K_F16) {
        double d = v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
        if (q.kind == K_F32) {
          float f = static_cast<float>(d);
          std::memcpy(slot, &f, 4);
        } else if (q.kind == K_F64) {
          std::memcpy(slot, &d, 8);
        } else {
          c10::Half h(static_cast<float>(d));
          std::memcpy(slot, &h, 2);
        }
        continue;
      }
      int64_t x;
      if (v.isBool()) x = v.toBool() ? 1 : 0;
      else if (v.isInt()) x = v.toInt();
      else x = v.toSymInt().guard_int(__FILE__, __LINE__);
      if (p.grid_mode == 1 && p.grid_src == static_cast<int>(k)) grid_value = x;
      int64_t lo = INT64_MIN, hi = INT64_MAX;
      switch (q.kind) {
        case K_I8: lo = -128; hi = 127; break;
        case K_U8: lo = 0; hi = 255; break;
        case K_I16: lo = -32768; hi = 32767; break;
        case K_U16: lo = 0; hi = 65535; break;
        case K_I32: lo = INT32_MIN; hi = INT32_MAX; break;
        case K_U32: lo = 0; hi = UINT32_MAX; break;
        case K_U64: lo = 0; break;
        default: break;
      }
      if (x < lo || x > hi) {
        err = cat(p.label, ": kernel parameter ", k, " = ", x,
                  " is out of its C type's range [", lo, ", ", hi, "]");
        return false;
      }
      switch (q.kind) {
        case K_I8: case K_U8: { uint8_t b = static_cast<uint8_t>(x); std::memcpy(slot, &b, 1); break; }
        case K_I16: case K_U16: { uint16_t b = static_cast<uint16_t>(x); std::memcpy(slot, &b, 2); break; }
        case K_I32: case K_U32: { uint32_t b = static_cast<uint32_t>(x); std::memcpy(slot, &b, 4); break; }
        default: std::memcpy(slot, &x, 8); break;
      }
    }
    unsigned g[3] = {p.grid[0], p.grid[1], p.grid[2]};
    bool empty = false;
    if (p.grid_mode == 1) {
      const int64_t n = grid_value < 0 ? -1 : grid_value / p.grid_per + (grid_value % p.grid_per != 0);
      if (n < 0 || n > 0x7fffffffLL) {
        err = cat(p.label, ": the grid's size argument ", grid_value, " gives grid ", n,
                  " (must be 0 .. 2^31 - 1)");
        return false;
      }
      g[0] = static_cast<unsigned>(n);
      empty = n == 0;
    }
    // phase 2: copies, outputs, pointers, launch. The copies and outputs live in tensors /
    // outs until run() returns: the packed pointers stay valid through the launch.
    for (int i = 0; i < p.n_in; i++) {
      if (p.inputs[i].type != A_TENSOR) continue;
      const at::Tensor& t = stack[base + i].toTensor();
      tensors[i] = t.is_contiguous() ? t : t.contiguous();
    }
    c10::OptionalDeviceGuard guard;
    if (!p.cpu) guard.reset_device(c10::Device(c10::DeviceType::CUDA, device));
    std::vector<at::Tensor> outs;
    outs.reserve(p.n_out);
    for (int j = 0; j < p.n_out; j++) {  // empty_like(x, contiguous) in one dispatch, not two
      const at::Tensor& like = tensors[p.out_like[j]];
      outs.push_back(at::empty(like.sizes(), like.options(), at::MemoryFormat::Contiguous));
    }
    for (size_t k = 0; k < p.params.size(); k++) {
      const Param& q = p.params[k];
      if (q.kind != K_PTR) continue;
      const at::Tensor& t = q.src >= 0 ? tensors[q.src] : outs[-(q.src + 1)];
      void* ptr = t.data_ptr();
      std::memcpy(buf + q.offset, &ptr, sizeof(ptr));
    }
    if (!empty) {
      uint64_t func = p.funcs[device].load(std::memory_order_acquire);
      if (func == 0) {
        func = p.prepare(device);  // Python (ctypes takes the GIL): loads the kernel there
        if (func == 0) {
          err = cat(p.label, ": cannot load the kernel on cuda:", device,
                    " (the error was printed above)");
          return false;
        }
        p.funcs[device].store(func, std::memory_order_release);
      }
      void* stream = nullptr;
      if (p.stream(device, &stream) != 0) {
        err = cat(p.label, ": cannot get torch's current CUDA stream");
        return false;
      }
      int code = launch(p, g, func, stream, ptrs);
      if (code == 201) {  // CUDA_ERROR_INVALID_CONTEXT: a thread with no context current yet
        p.prepare(-(device + 1));  // Python: make the device's primary context current
        code = launch(p, g, func, stream, ptrs);
      }
      if (code != 0) {
        err = cat(p.label, ": the driver refused the launch (CUresult ", code,
                  ") with grid ", g[0], "x", g[1], "x", g[2], ", block ", p.block[0], "x",
                  p.block[1], "x", p.block[2], ", shared_mem ", p.shmem);
        return false;
      }
    }
    for (int i = 0; i < p.n_in; i++)
      if (p.inputs[i].mutated) stack[base + i].toTensor().unsafeGetTensorImpl()->bump_version();
    p.calls.fetch_add(1, std::memory_order_relaxed);
    torch::jit::drop(stack, p.n_in);  // the inputs (and the references above) go here
    for (auto& o : outs) stack.emplace_back(std::move(o));
    return true;
  }
};

struct Handle {
  std::shared_ptr<Plan> plan;
  std::unique_ptr<torch::Library> lib;
};

// -- the eager entry ------------------------------------------------------------------------

struct Fast {
  std::shared_ptr<Plan> plan;
  PyObject* fallback;  // the op's OpOverload (a new reference)
};

constexpr const char* FAST_CAPSULE = "cuforge.opshim.fast";

// the dispatch functionalities a plain tensor may carry (the backend bits are kept by
// operator-, so this serves the CUDA key and the tests' CPU key alike)
const c10::DispatchKeySet PLAIN = c10::DispatchKeySet(c10::DispatchKey::CUDA) |
                                  c10::DispatchKeySet(c10::DispatchKey::AutogradCUDA) |
                                  c10::DispatchKeySet(c10::DispatchKey::ADInplaceOrView) |
                                  c10::DispatchKeySet(c10::DispatchKey::AutocastCUDA) |
                                  c10::DispatchKeySet(c10::DispatchKey::AutocastCPU);

// the call as the dispatcher would see it is the same as the kernel's own: see the header.
// types: each input's A_* type; cpu: the kernel serves the CPU key (else CUDA). stack: the
// IValues for the C++ kernel, or nullptr for the Python kernel's entry, which hands the Python
// objects on as they are: then a float argument must be a Python float already (the
// dispatcher would hand the kernel a float for an int)
bool plain_call(const int* types, int n, bool cpu, PyObject* const* args,
                torch::jit::Stack* stack) {
  if (c10::impl::TorchDispatchModeTLS::any_modes_set() || at::impl::torch_function_mode_enabled() ||
      !(c10::impl::tls_local_dispatch_key_set().included_ - c10::default_included_set).empty() ||
      at::hasCallbacks())
    return false;
  const bool grad = c10::GradMode::is_enabled();
  for (int i = 0; i < n; i++) {
    PyObject* a = args[i];
    switch (types[i]) {
      case A_TENSOR: {
        if (!THPVariable_CheckExact(a)) return false;
        const at::Tensor& t = THPVariable_Unpack(a);
        if ((t.key_set() - PLAIN).highestFunctionalityKey() != c10::DispatchKey::Undefined)
          return false;
        // on the kernel's own device only: a meta (opcheck, fake tracing outside a mode) or
        // CPU tensor goes to the dispatcher, to its Meta or CPU kernel (PLAIN's functionality
        // bits alone let any backend through)
        if (cpu ? !t.is_cpu() : !t.is_cuda()) return false;
        if (grad && t.requires_grad()) return false;
        if (stack) stack->emplace_back(t);
        break;
      }
      case A_INT: {
        if (!PyLong_CheckExact(a)) return false;
        int overflow = 0;
        const long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
          PyErr_Clear();
          return false;
        }
        if (stack) stack->emplace_back(static_cast<int64_t>(v));
        break;
      }
      case A_FLOAT:
        if (PyFloat_CheckExact(a)) {
          if (stack) stack->emplace_back(PyFloat_AS_DOUBLE(a));
        } else if (stack && PyLong_CheckExact(a)) {
          const double v = PyLong_AsDouble(a);
          if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return false;
          }
          stack->emplace_back(v);
        } else {
          return false;
        }
        break;
      default:  // A_BOOL
        if (!PyBool_Check(a)) return false;
        if (stack) stack->emplace_back(a == Py_True);
        break;
    }
  }
  return true;
}

PyObject* fast_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  auto* f = static_cast<Fast*>(PyCapsule_GetPointer(self, FAST_CAPSULE));
  if (f == nullptr) return nullptr;
  const Plan& p = *f->plan;
  torch::jit::Stack stack;
  stack.reserve(p.n_in + p.n_out);
  if (nargs != p.n_in || !plain_call(p.types.data(), p.n_in, p.cpu, args, &stack))
    return PyObject_Vectorcall(f->fallback, args, static_cast<size_t>(nargs), nullptr);
  f->plan->fast_calls.fetch_add(1, std::memory_order_relaxed);
  std::string err;
  if (!Kernel::run(*f->plan, stack, err)) {
    PyErr_SetString(PyExc_RuntimeError, err.c_str());
    return nullptr;
  }
  if (p.n_out == 0) Py_RETURN_NONE;
  if (p.n_out == 1) return THPVariable_Wrap(std::move(stack[0]).toTensor());
  PyObject* out = PyTuple_New(p.n_out);
  if (out == nullptr) return nullptr;
  for (int j = 0; j < p.n_out; j++) {
    PyObject* t = THPVariable_Wrap(std::move(stack[j]).toTensor());
    if (t == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, j, t);
  }
  return out;
  END_HANDLE_TH_ERRORS
}

PyMethodDef FAST_DEF = {"cuforge_opshim_call", reinterpret_cast<PyCFunction>(fast_call),
                        METH_FASTCALL, "a cuforge custom op's eager entry (cuforge.torch.opshim)"};

void fast_free(PyObject* capsule) {
  auto* f = static_cast<Fast*>(PyCapsule_GetPointer(capsule, FAST_CAPSULE));
  if (f == nullptr) {
    PyErr_Clear();
    return;
  }
  Py_XDECREF(f->fallback);
  delete f;
}

// -- the Python kernel's eager entry ---------------------------------------------------------
// For an op whose device kernel stays Python (a lambda grid, a launcher: docs/custom_ops.md),
// the same checks, then that Python kernel called straight with the call's own arguments:
// what the dispatcher would do for a plain call, without torch's Python -> IValue ->
// dispatcher -> Python round trip.

struct PyFast {
  std::vector<int> types;
  std::vector<int> mutated;  // the inputs whose version counters a call bumps
  bool cpu;
  PyObject* fn;        // the op's Python kernel (a new reference)
  PyObject* fallback;  // the op's OpOverload (a new reference)
  PyObject* hook;      // Dynamo's get_eval_frame_callback (a new reference), or nullptr
  std::atomic<uint64_t> calls{0};
};

// Dynamo's frame hook is set (a graph break in a compiled region runs this call): the
// kernel must run with Dynamo off, as the registered one does (custom_ops._dynamo_disabled)
// -- the OpOverload's way. -1: the hook raised (the error is set)
int dynamo_active(PyObject* hook) {
  if (hook == nullptr) return 0;
  PyObject* r = PyObject_CallNoArgs(hook);
  if (r == nullptr) return -1;
  const int active = r != Py_None && r != Py_False;
  Py_DECREF(r);
  return active;
}

constexpr const char* PY_CAPSULE = "cuforge.opshim.pyfast";

PyObject* py_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  auto* f = static_cast<PyFast*>(PyCapsule_GetPointer(self, PY_CAPSULE));
  if (f == nullptr) return nullptr;
  const int n = static_cast<int>(f->types.size());
  if (nargs != n || !plain_call(f->types.data(), n, f->cpu, args, nullptr))
    return PyObject_Vectorcall(f->fallback, args, static_cast<size_t>(nargs), nullptr);
  const int active = dynamo_active(f->hook);
  if (active < 0) return nullptr;
  if (active) return PyObject_Vectorcall(f->fallback, args, static_cast<size_t>(nargs), nullptr);
  f->calls.fetch_add(1, std::memory_order_relaxed);
  PyObject* result = PyObject_Vectorcall(f->fn, args, static_cast<size_t>(nargs), nullptr);
  // what the registered kernel's wrapper does after the kernel (custom_ops._device_kernel;
  // its grad check is plain_call's): bump each written tensor's version counter
  if (result != nullptr)
    for (int i : f->mutated) THPVariable_Unpack(args[i]).unsafeGetTensorImpl()->bump_version();
  return result;
  END_HANDLE_TH_ERRORS
}

PyMethodDef PY_DEF = {"cuforge_opshim_pycall", reinterpret_cast<PyCFunction>(py_call),
                      METH_FASTCALL,
                      "a cuforge custom op's eager entry to its Python kernel (cuforge.torch.opshim)"};

void py_free(PyObject* capsule) {
  auto* f = static_cast<PyFast*>(PyCapsule_GetPointer(capsule, PY_CAPSULE));
  if (f == nullptr) {
    PyErr_Clear();
    return;
  }
  Py_XDECREF(f->fn);
  Py_XDECREF(f->fallback);
  Py_XDECREF(f->hook);
  delete f;
}

}  // namespace

extern "C" {

int cfshim_abi_version() { return 3; }

// spec (int64): n_in, n_params, n_out, buf_size, gx, gy, gz, bx, by, bz, shmem, grid_mode,
// grid_src, grid_per, grad_check, cpu; per param: src, kind, offset, dtype; per input: type,
// readonly, mutated; per output: the input it is shaped like. names: the op inputs' names,
// '\n'-separated. Returns a handle (nullptr and a message in err on failure).
void* cfshim_register(const char* ns, const char* name, const char* label, const char* names,
                      const int64_t* spec, void* launch_ex, void* launch, void* stream,
                      void* prepare, char* err, int errlen) {
  try {
    auto p = std::make_shared<Plan>();
    p->label = label;
    int at = 0;
    p->n_in = static_cast<int>(spec[at++]);
    int n_params = static_cast<int>(spec[at++]);
    p->n_out = static_cast<int>(spec[at++]);
    p->buf_size = static_cast<int>(spec[at++]);
    for (int i = 0; i < 3; i++) p->grid[i] = static_cast<unsigned>(spec[at++]);
    for (int i = 0; i < 3; i++) p->block[i] = static_cast<unsigned>(spec[at++]);
    p->shmem = static_cast<unsigned>(spec[at++]);
    p->grid_mode = static_cast<int>(spec[at++]);
    p->grid_src = static_cast<int>(spec[at++]);
    p->grid_per = spec[at++];
    p->grad_check = spec[at++] != 0;
    p->cpu = spec[at++] != 0;
    need(n_params >= 1 && n_params <= MAXP && p->n_in <= MAXP, "bad parameter count");
    need(p->buf_size >= 0 && p->buf_size <= MAXBUF, "parameter buffer too large");
    need(p->grid_per >= 1, "grid divisor must be >= 1");
    for (int k = 0; k < n_params; k++) {
      Param q{static_cast<int>(spec[at]), static_cast<int>(spec[at + 1]), spec[at + 2],
              static_cast<int>(spec[at + 3])};
      at += 4;
      need(q.offset >= 0 && q.offset + 8 <= MAXBUF, "bad parameter offset");
      p->params.push_back(q);
    }
    for (int i = 0; i < p->n_in; i++) {
      p->inputs.push_back(
          Input{static_cast<int>(spec[at]), spec[at + 1] != 0, spec[at + 2] != 0, {}});
      p->types.push_back(p->inputs.back().type);
      at += 3;
    }
    for (int j = 0; j < p->n_out; j++) p->out_like.push_back(static_cast<int>(spec[at++]));
    // every index the kernel follows at call time, checked once here
    for (int j = 0; j < p->n_out; j++)
      need(p->out_like[j] >= 0 && p->out_like[j] < p->n_in &&
               p->inputs[p->out_like[j]].type == A_TENSOR,
           cat("output ", j, " is shaped like input ", p->out_like[j], ", not a tensor input"));
    for (size_t k = 0; k < p->params.size(); k++) {
      const Param& q = p->params[k];
      need(q.kind >= K_PTR && q.kind <= K_U64, cat("parameter ", k, ": bad kind ", q.kind));
      if (q.src < 0) {
        need(q.kind == K_PTR && -(q.src + 1) < p->n_out,
             cat("parameter ", k, ": bad output index"));
      } else {
        need(q.src < p->n_in, cat("parameter ", k, ": bad input index"));
        need((q.kind == K_PTR) == (p->inputs[q.src].type == A_TENSOR),
             cat("parameter ", k,
                 ": a pointer must come from a tensor input, a scalar from a scalar one"));
      }
    }
    // each pointer parameter's dtype, checked on the tensor input it comes from (an
    // output's: the input it is shaped like, whose dtype it is allocated with)
    for (size_t k = 0; k < p->params.size(); k++) {
      const Param& q = p->params[k];
      if (q.kind != K_PTR || q.dtype < 0) continue;
      const int src = q.src >= 0 ? q.src : p->out_like[-(q.src + 1)];
      p->inputs[src].dtypes.emplace_back(static_cast<int>(k), q.dtype);
    }
    need(p->grid_mode == 0 ||
             (p->grid_src >= 0 && p->grid_src < static_cast<int>(p->params.size())),
         "bad grid parameter index");
    std::string all(names);
    size_t start = 0;
    for (int i = 0; i < p->n_in; i++) {
      size_t end = all.find('\n', start);
      p->input_names.push_back(all.substr(start, end == std::string::npos ? end : end - start));
      start = end == std::string::npos ? all.size() : end + 1;
    }
    p->launch_ex = reinterpret_cast<launch_ex_t>(launch_ex);
    p->launch = reinterpret_cast<launch_t>(launch);
    p->stream = reinterpret_cast<stream_t>(stream);
    p->prepare = reinterpret_cast<prepare_t>(prepare);
    need(p->stream != nullptr && p->prepare != nullptr &&
             (p->launch_ex != nullptr || p->launch != nullptr),
         "an entry point address is 0");
    for (auto& f : p->funcs) f.store(0);
    auto h = std::make_unique<Handle>();
    h->plan = p;
    h->lib = std::make_unique<torch::Library>(torch::Library::IMPL, std::string(ns),
                                              p->cpu ? c10::DispatchKey::CPU
                                                     : c10::DispatchKey::CUDA,
                                              __FILE__, __LINE__);
    h->lib->impl(name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(p)));
    return h.release();
  } catch (const std::exception& e) {
    if (err && errlen > 0) {
      std::strncpy(err, e.what(), errlen - 1);
      err[errlen - 1] = 0;
    }
    return nullptr;
  }
}

// forget the kernel loaded on a device (0: load again through prepare on the next call)
void cfshim_set_func(void* handle, int device, uint64_t func) {
  if (handle && device >= 0 && device < MAXDEV)
    static_cast<Handle*>(handle)->plan->funcs[device].store(func);
}

uint64_t cfshim_calls(void* handle) {
  return handle ? static_cast<Handle*>(handle)->plan->calls.load() : 0;
}

uint64_t cfshim_fast_calls(void* handle) {
  return handle ? static_cast<Handle*>(handle)->plan->fast_calls.load() : 0;
}

// the op's eager entry: a new builtin (a new reference; nullptr with a Python error set),
// calling ``fallback`` (the op's OpOverload) for any call it does not take itself. Called
// through ctypes.PyDLL: the GIL is held.
PyObject* cfshim_fast(void* handle, PyObject* fallback) {
  if (handle == nullptr || fallback == nullptr) {
    PyErr_SetString(PyExc_ValueError, "cfshim_fast: no handle or no fallback");
    return nullptr;
  }
  auto* f = new Fast{static_cast<Handle*>(handle)->plan, fallback};
  Py_INCREF(fallback);
  PyObject* capsule = PyCapsule_New(f, FAST_CAPSULE, fast_free);
  if (capsule == nullptr) {
    Py_DECREF(fallback);
    delete f;
    return nullptr;
  }
  PyObject* fn = PyCFunction_NewEx(&FAST_DEF, capsule, nullptr);
  Py_DECREF(capsule);  // the function holds it
  return fn;
}

// the eager entry of an op whose device kernel is Python: a new builtin calling ``fn`` (the
// op's Python kernel) for a plain call, then bumping the version counters of the inputs
// flagged in ``mutated``, and ``fallback`` (the op's OpOverload) for any other call -- also
// while ``hook`` (Dynamo's get_eval_frame_callback; None: no check) returns a callback.
// types: each argument's A_* type (n of them); cpu: ``fn`` serves the CPU key, else CUDA.
// Through ctypes.PyDLL: the GIL is held.
PyObject* cfshim_py_entry(const int64_t* types, const int64_t* mutated, int n, int cpu,
                          PyObject* fn, PyObject* fallback, PyObject* hook) {
  if (fn == nullptr || fallback == nullptr || hook == nullptr || n < 0 || n > MAXP) {
    PyErr_SetString(PyExc_ValueError, "cfshim_py_entry: no kernel, no fallback or bad count");
    return nullptr;
  }
  for (int i = 0; i < n; i++)
    if (mutated[i] != 0 && types[i] != A_TENSOR) {
      PyErr_SetString(PyExc_ValueError, "cfshim_py_entry: a written argument is not a tensor");
      return nullptr;
    }
  if (hook == Py_None) hook = nullptr;
  auto* f = new PyFast{{}, {}, cpu != 0, fn, fallback, hook};
  for (int i = 0; i < n; i++) {
    f->types.push_back(static_cast<int>(types[i]));
    if (mutated[i] != 0) f->mutated.push_back(i);
  }
  Py_INCREF(fn);
  Py_INCREF(fallback);
  Py_XINCREF(hook);
  PyObject* capsule = PyCapsule_New(f, PY_CAPSULE, py_free);
  if (capsule == nullptr) {
    Py_DECREF(fn);
    Py_DECREF(fallback);
    Py_XDECREF(hook);
    delete f;
    return nullptr;
  }
  PyObject* entry = PyCFunction_NewEx(&PY_DEF, capsule, nullptr);
  Py_DECREF(capsule);  // the function holds it (and frees it with itself)
  return entry;
}

// the calls ``entry`` (from cfshim_py_entry) handed to the Python kernel itself; -1: not one
int64_t cfshim_py_entry_calls(PyObject* entry) {
  if (entry == nullptr || !PyCFunction_Check(entry)) return -1;
  PyObject* capsule = PyCFunction_GET_SELF(entry);
  if (capsule == nullptr || !PyCapsule_IsValid(capsule, PY_CAPSULE)) return -1;
  return static_cast<int64_t>(
      static_cast<PyFast*>(PyCapsule_GetPointer(capsule, PY_CAPSULE))->calls.load());
}

// drop the registration (the dispatcher forgets the kernel)
void cfshim_unregister(void* handle) { delete static_cast<Handle*>(handle); }

}  // extern "C"
