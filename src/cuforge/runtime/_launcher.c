/* The C launch path of cuforge (see cuforge/runtime/fastlaunch.py): a small CPython
   extension, compiled once per machine with the system C compiler.

   State: one per kernel argument layout: parameter kinds and buffer offsets, the kernel's
   argument buffer, the per-device functions and shared-memory limits, the driver entry
   point, and the torch / CuPy types and descriptors it checks arguments against.
   Launcher: one per launch configuration (grid, block, shared memory, stream); calling it
   checks and packs the arguments and calls the driver, or hands everything to the Python
   general path (State's `slow`) when anything is not exactly what it handles.
   Subscript: `k[grid, block]` as a dict lookup in C. JitDispatch: cuforge.jit's launcher
   (the specialization lookup in front of an executor's Launcher).

   The built library's file name carries a hash of this text, the Python version and ABI,
   and the compiler: editing this file makes every process build a fresh one. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>

typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void*, void**, void**);

/* CUlaunchConfig (cuda.h), no attributes: cuLaunchKernelEx reads it by address, which passes
   four arguments instead of eleven (measured ~5% less host time per launch on an H100) */
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void* hStream;
    void* attrs;
    unsigned numAttrs;
} launch_config_t;
typedef int (*launch_ex_t)(const launch_config_t*, void*, void**, void**);

/* torch's stable C shim (torch/csrc/inductor/aoti_torch/c/shim.h, exported by libtorch_cpu):
   each takes an AtenTensorHandle (an at::Tensor*) and returns 0 on success */
typedef int32_t (*t_i32_t)(void*, int32_t*);
typedef int32_t (*t_ptr_t)(void*, void**);
typedef int32_t (*t_bool_t)(void*, _Bool*);
typedef int32_t (*t_stream_t)(int32_t, void**);  /* aoti_torch_get_current_cuda_stream */

enum { K_PTR = 0, K_F32, K_F64, K_F16, K_I8, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_U64 };
#define MAXP 64
#define MAXDEV 64

static PyObject *s_dtype, *s_c_contiguous, *s_data, *s_ptr, *s_device_id;

typedef struct {
    PyObject_HEAD
    int ready;
    int n;
    int kinds[MAXP];
    Py_ssize_t offsets[MAXP];
    PyObject* dtypes[MAXP];
    char* buf;
    void** params;
    void* funcs[MAXDEV];
    long long shm_ok[MAXDEV];
    int check_device;
    launch_t launch;  /* cuLaunchKernel */
    launch_ex_t launch_ex;  /* cuLaunchKernelEx (set_launch_ex), used when set; else launch */
    PyObject* tensor_type;
    PyObject* t_dtype;          /* torch.Tensor's descriptors, called directly */
    PyObject* t_is_contiguous;
    PyObject* t_get_device;
    PyObject* t_data_ptr;
    PyObject* raw_stream;
    PyObject* cur_dev;
    PyObject* slow;
    PyObject* fail;
    PyObject* keep;
    PyObject* cupy_type;
    PyObject* cupy_dtypes[MAXP];
    PyObject* cupy_stream;
    PyObject* cupy_cur_dev;
    /* torch tensors read through torch's C shim instead of four method calls: the
       at::Tensor lives at t_off in the tensor object (THPVariable.cdata), checked by
       fastpath.torch_abi() against the methods before this is switched on */
    int t_abi;
    Py_ssize_t t_off;
    int32_t t_cuda;
    t_i32_t t_get_dtype, t_get_device_type, t_get_device_index;
    t_bool_t t_is_contiguous_c;
    t_ptr_t t_get_data_ptr;
    int32_t t_codes[MAXP];  /* the declared dtype's ScalarType code; -1: any */
    t_stream_t t_stream;    /* torch's current stream, without calling raw_stream (or NULL) */
} State;

/* State and Launcher take part in garbage collection: a launcher keeps its kernel alive
   (through the state's callbacks), and the kernel holds its launchers. */
static int State_traverse(State* self, visitproc visit, void* arg) {
    for (int i = 0; i < self->n; i++) { Py_VISIT(self->dtypes[i]); Py_VISIT(self->cupy_dtypes[i]); }
    Py_VISIT(self->cupy_type);
    Py_VISIT(self->cupy_stream);
    Py_VISIT(self->cupy_cur_dev);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->t_dtype);
    Py_VISIT(self->t_is_contiguous);
    Py_VISIT(self->t_get_device);
    Py_VISIT(self->t_data_ptr);
    Py_VISIT(self->raw_stream);
    Py_VISIT(self->cur_dev);
    Py_VISIT(self->slow);
    Py_VISIT(self->fail);
    Py_VISIT(self->keep);
    return 0;
}

static int State_clear(State* self) {
    self->ready = 0;
    for (int i = 0; i < self->n; i++) { Py_CLEAR(self->dtypes[i]); Py_CLEAR(self->cupy_dtypes[i]); }
    Py_CLEAR(self->cupy_type);
    Py_CLEAR(self->cupy_stream);
    Py_CLEAR(self->cupy_cur_dev);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->t_dtype);
    Py_CLEAR(self->t_is_contiguous);
    Py_CLEAR(self->t_get_device);
    Py_CLEAR(self->t_data_ptr);
    Py_CLEAR(self->raw_stream);
    Py_CLEAR(self->cur_dev);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->fail);
    Py_CLEAR(self->keep);
    return 0;
}

static void State_dealloc(State* self) {
    PyObject_GC_UnTrack(self);
    State_clear(self);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

/* State(kinds, offsets, buf_addr, params_addr, launch_addr, check_device,
         slow, fail, keep); then set_torch(...) / set_cupy(...) as those frameworks appear */
static int State_init(State* self, PyObject* args, PyObject* kw) {
    PyObject *kinds, *offsets, *slow, *fail, *keep;
    unsigned long long buf, params, launch;
    int check_device;
    if (!PyArg_ParseTuple(args, "OOKKKiOOO", &kinds, &offsets, &buf, &params, &launch,
                          &check_device, &slow, &fail, &keep))
        return -1;
    if (self->n) { PyErr_SetString(PyExc_RuntimeError, "State is initialized once"); return -1; }
    Py_ssize_t n = PySequence_Size(kinds);
    if (n < 1 || n > MAXP || PySequence_Size(offsets) != n) {
        PyErr_SetString(PyExc_ValueError, "bad State arguments");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* k = PySequence_GetItem(kinds, i);
        PyObject* o = PySequence_GetItem(offsets, i);
        if (!k || !o) { Py_XDECREF(k); Py_XDECREF(o); return -1; }
        self->kinds[i] = (int)PyLong_AsLong(k);
        self->offsets[i] = PyLong_AsSsize_t(o);
        Py_DECREF(k);
        Py_DECREF(o);
        self->dtypes[i] = NULL;
        self->cupy_dtypes[i] = NULL;
        if (PyErr_Occurred()) return -1;
    }
    self->n = (int)n;
    self->buf = (char*)(uintptr_t)buf;
    self->params = (void**)(uintptr_t)params;
    self->launch = (launch_t)(uintptr_t)launch;
    self->check_device = check_device;
    for (int i = 0; i < MAXDEV; i++) { self->funcs[i] = NULL; self->shm_ok[i] = -1; }
    Py_INCREF(slow); self->slow = slow;
    Py_INCREF(fail); self->fail = fail;
    Py_INCREF(keep); self->keep = keep;
    self->ready = 1;
    return 0;
}

static int set_dtypes(PyObject* seq, PyObject** out, int n) {
    if (PySequence_Size(seq) != n) { PyErr_SetString(PyExc_ValueError, "dtypes: one per parameter"); return -1; }
    for (int i = 0; i < n; i++) {
        PyObject* d = PySequence_GetItem(seq, i);
        if (!d) return -1;
        Py_CLEAR(out[i]);
        if (d == Py_None) Py_DECREF(d);
        else out[i] = d;  /* owned */
    }
    return 0;
}

#define REPLACE(field, value) do { PyObject* _old = (field); Py_INCREF(value); (field) = (value); Py_XDECREF(_old); } while (0)

/* set_torch(Tensor, dtypes, raw_stream, cur_dev, dtype_descr, is_contiguous, get_device, data_ptr) */
static PyObject* State_set_torch(State* self, PyObject* args) {
    PyObject *type, *dtypes, *raw_stream, *cur_dev, *d_dtype, *d_contig, *d_dev, *d_ptr;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &type, &dtypes, &raw_stream, &cur_dev, &d_dtype, &d_contig,
                          &d_dev, &d_ptr))
        return NULL;
    if (set_dtypes(dtypes, self->dtypes, self->n) < 0) return NULL;
    REPLACE(self->t_dtype, d_dtype);
    REPLACE(self->t_is_contiguous, d_contig);
    REPLACE(self->t_get_device, d_dev);
    REPLACE(self->t_data_ptr, d_ptr);
    REPLACE(self->raw_stream, raw_stream);
    REPLACE(self->cur_dev, cur_dev);
    REPLACE(self->tensor_type, type);  /* last: enables the torch branch */
    Py_RETURN_NONE;
}

/* set_cupy(ndarray, dtypes, current_stream_ptr, cur_dev) */
static PyObject* State_set_cupy(State* self, PyObject* args) {
    PyObject *type, *dtypes, *stream, *cur_dev;
    if (!PyArg_ParseTuple(args, "OOOO", &type, &dtypes, &stream, &cur_dev)) return NULL;
    if (set_dtypes(dtypes, self->cupy_dtypes, self->n) < 0) return NULL;
    REPLACE(self->cupy_stream, stream);
    REPLACE(self->cupy_cur_dev, cur_dev);
    REPLACE(self->cupy_type, type);
    Py_RETURN_NONE;
}

/* the five shim entry points, as addresses: (dtype, device_type, device_index, is_contiguous,
   data_ptr) */
static int abi_fns(PyObject* fns, t_i32_t* f) {
    unsigned long long a[5];
    if (!PyArg_ParseTuple(fns, "KKKKK", &a[0], &a[1], &a[2], &a[3], &a[4])) return -1;
    for (int i = 0; i < 5; i++)
        if (!a[i]) { PyErr_SetString(PyExc_ValueError, "a torch shim address is 0"); return -1; }
    f[0] = (t_i32_t)(uintptr_t)a[0];
    f[1] = (t_i32_t)(uintptr_t)a[1];
    f[2] = (t_i32_t)(uintptr_t)a[2];
    f[3] = (t_i32_t)(uintptr_t)a[3];
    f[4] = (t_i32_t)(uintptr_t)a[4];
    return 0;
}

/* set_torch_abi(offset, fns, cuda_code, codes): read exact torch.Tensor arguments through
   the shim (set_torch first: the stream and device getters come from there) */
static PyObject* State_set_torch_abi(State* self, PyObject* args) {
    Py_ssize_t off;
    PyObject *fns, *codes;
    int cuda;
    if (!PyArg_ParseTuple(args, "nOiO", &off, &fns, &cuda, &codes)) return NULL;
    if (self->tensor_type == NULL) { PyErr_SetString(PyExc_RuntimeError, "set_torch first"); return NULL; }
    t_i32_t f[5];
    if (abi_fns(fns, f) < 0) return NULL;
    if (off < (Py_ssize_t)sizeof(PyObject) || PySequence_Size(codes) != self->n) {
        PyErr_SetString(PyExc_ValueError, "set_torch_abi: bad offset or not one code per parameter");
        return NULL;
    }
    int32_t c[MAXP];
    for (int i = 0; i < self->n; i++) {
        PyObject* o = PySequence_GetItem(codes, i);
        if (!o) return NULL;
        c[i] = (int32_t)PyLong_AsLong(o);
        Py_DECREF(o);
        if (PyErr_Occurred()) return NULL;
    }
    self->t_abi = 0;
    self->t_off = off;
    self->t_cuda = cuda;
    self->t_get_dtype = f[0];
    self->t_get_device_type = f[1];
    self->t_get_device_index = f[2];
    self->t_is_contiguous_c = (t_bool_t)f[3];
    self->t_get_data_ptr = (t_ptr_t)f[4];
    memcpy(self->t_codes, c, sizeof(int32_t) * self->n);
    self->t_abi = 1;
    Py_RETURN_NONE;
}

/* set_launch_ex(addr): launch through cuLaunchKernelEx at addr (0: cuLaunchKernel again) */
static PyObject* State_set_launch_ex(State* self, PyObject* arg) {
    unsigned long long a = PyLong_AsUnsignedLongLong(arg);
    if (a == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    self->launch_ex = (launch_ex_t)(uintptr_t)a;
    Py_RETURN_NONE;
}

static PyObject* State_launch_entry(State* self, PyObject* unused) {
    return PyUnicode_FromString(self->launch_ex != NULL ? "cuLaunchKernelEx" : "cuLaunchKernel");
}

/* set_torch_stream(addr): torch's current stream through aoti_torch_get_current_cuda_stream
   (0: through the raw_stream callable again) */
static PyObject* State_set_torch_stream(State* self, PyObject* arg) {
    unsigned long long a = PyLong_AsUnsignedLongLong(arg);
    if (a == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    self->t_stream = (t_stream_t)(uintptr_t)a;
    Py_RETURN_NONE;
}

static PyObject* State_set_device(State* self, PyObject* args) {
    int dev;
    unsigned long long func;
    long long shm;
    if (!PyArg_ParseTuple(args, "iKL", &dev, &func, &shm)) return NULL;
    if (dev < 0 || dev >= MAXDEV) { PyErr_SetString(PyExc_ValueError, "device out of range"); return NULL; }
    self->funcs[dev] = (void*)(uintptr_t)func;
    self->shm_ok[dev] = shm;
    Py_RETURN_NONE;
}

static PyObject* State_disable(State* self, PyObject* unused) {
    self->ready = 0;
    Py_RETURN_NONE;
}

static PyMethodDef State_methods[] = {
    {"set_device", (PyCFunction)State_set_device, METH_VARARGS, "set_device(dev, func, shm_ok)"},
    {"set_launch_ex", (PyCFunction)State_set_launch_ex, METH_O,
     "launch through cuLaunchKernelEx at this address (0: cuLaunchKernel)"},
    {"launch_entry", (PyCFunction)State_launch_entry, METH_NOARGS,
     "the driver entry point launches go through"},
    {"disable", (PyCFunction)State_disable, METH_NOARGS, "send every launch to the slow path"},
    {"set_torch", (PyCFunction)State_set_torch, METH_VARARGS, "enable torch tensors"},
    {"set_cupy", (PyCFunction)State_set_cupy, METH_VARARGS, "enable CuPy arrays"},
    {"set_torch_stream", (PyCFunction)State_set_torch_stream, METH_O,
     "torch's current stream through its C shim"},
    {"set_torch_abi", (PyCFunction)State_set_torch_abi, METH_VARARGS,
     "read torch tensors through torch's C shim"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject StateType = {PyVarObject_HEAD_INIT(NULL, 0)};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    State* st;
    PyObject* cfg;
    unsigned g[3], b[3], shmem;
    long long check;
    int default_stream;
    void* stream;
    launch_config_t lc;  /* the same dims for cuLaunchKernelEx; hStream is set per call */
} Launcher;

static int Launcher_traverse(Launcher* self, visitproc visit, void* arg) {
    Py_VISIT(self->st);
    Py_VISIT(self->cfg);
    return 0;
}

static int Launcher_clear(Launcher* self) {
    Py_CLEAR(self->st);
    Py_CLEAR(self->cfg);
    return 0;
}

static void Launcher_dealloc(Launcher* self) {
    PyObject_GC_UnTrack(self);
    Launcher_clear(self);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* args_tuple(PyObject* const* args, Py_ssize_t n) {
    PyObject* t = PyTuple_New(n);
    if (!t) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) { Py_INCREF(args[i]); PyTuple_SET_ITEM(t, i, args[i]); }
    return t;
}

static PyObject* slow_path(Launcher* self, PyObject* const* args, Py_ssize_t n) {
    if (PyErr_Occurred()) PyErr_Clear();
    PyObject* t = args_tuple(args, n);
    if (!t) return NULL;
    PyObject* r = PyObject_CallFunctionObjArgs(self->st->slow, self->cfg, t, NULL);
    Py_DECREF(t);
    return r;
}

/* obj.<method>() through the type's own method descriptor (no attribute lookup) */
static inline PyObject* call_descr(PyObject* descr, PyObject* obj) {
    return PyObject_Vectorcall(descr, &obj, 1, NULL);
}

/* obj.<attribute> through the type's own data descriptor */
static inline PyObject* get_descr(PyObject* descr, PyObject* obj, PyObject* name) {
    descrgetfunc get = Py_TYPE(descr)->tp_descr_get;
    if (get == NULL) return PyObject_GetAttr(obj, name);
    return get(descr, obj, (PyObject*)Py_TYPE(obj));
}

static PyObject* Launcher_vectorcall(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    Launcher* self = (Launcher*)op;
    State* st = self->st;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (st == NULL || self->cfg == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "launcher was cleared");
        return NULL;
    }
    if (kwnames != NULL || nargs != st->n || !st->ready) return slow_path(self, args, nargs);
    uint64_t vals[MAXP];
    int dev = -1;
    int frameworks = 0;  /* 1: torch tensors seen, 2: CuPy arrays seen */
    /* 1. gather and check every argument (Python calls happen here, before any write) */
    for (int i = 0; i < st->n; i++) {
        PyObject* a = args[i];
        int kind = st->kinds[i];
        if (kind == K_PTR) {
            PyObject* type = (PyObject*)Py_TYPE(a);
            long d;
            unsigned long long p;
            if (st->tensor_type != NULL && type == st->tensor_type && st->t_abi) {
                frameworks |= 1;
                void* h = (char*)a + st->t_off;
                int32_t v, ix;
                _Bool contiguous;
                void* ptr;
                if (st->t_get_dtype(h, &v) != 0 || (st->t_codes[i] >= 0 && v != st->t_codes[i]) ||
                    st->t_get_device_type(h, &v) != 0 || v != st->t_cuda ||
                    st->t_get_device_index(h, &ix) != 0 || st->t_is_contiguous_c(h, &contiguous) != 0 ||
                    !contiguous || st->t_get_data_ptr(h, &ptr) != 0)
                    return slow_path(self, args, nargs);
                d = ix;
                if (d < 0 || d >= MAXDEV || (dev >= 0 && d != dev)) return slow_path(self, args, nargs);
                p = (unsigned long long)(uintptr_t)ptr;
            } else if (st->tensor_type != NULL && type == st->tensor_type) {
                frameworks |= 1;
                if (st->dtypes[i] != NULL) {
                    PyObject* dt = get_descr(st->t_dtype, a, s_dtype);
                    if (dt == NULL) return slow_path(self, args, nargs);
                    int same = dt == st->dtypes[i];
                    Py_DECREF(dt);
                    if (!same) return slow_path(self, args, nargs);
                }
                PyObject* r = call_descr(st->t_is_contiguous, a);
                if (r == NULL) return slow_path(self, args, nargs);
                int contiguous = r == Py_True;
                Py_DECREF(r);
                if (!contiguous) return slow_path(self, args, nargs);
                r = call_descr(st->t_get_device, a);
                if (r == NULL) return slow_path(self, args, nargs);
                d = PyLong_AsLong(r);
                Py_DECREF(r);
                if (d < 0 || d >= MAXDEV || (dev >= 0 && d != dev)) return slow_path(self, args, nargs);
                r = call_descr(st->t_data_ptr, a);
                if (r == NULL) return slow_path(self, args, nargs);
                p = PyLong_AsUnsignedLongLong(r);
                Py_DECREF(r);
            } else if (st->cupy_type != NULL && type == st->cupy_type) {
                frameworks |= 2;
                if (st->cupy_dtypes[i] != NULL) {
                    PyObject* dt = PyObject_GetAttr(a, s_dtype);
                    if (dt == NULL) return slow_path(self, args, nargs);
                    int same = dt == st->cupy_dtypes[i];
                    Py_DECREF(dt);
                    if (!same) return slow_path(self, args, nargs);
                }
                PyObject* r = PyObject_GetAttr(a, s_c_contiguous);
                if (r == NULL) return slow_path(self, args, nargs);
                int contiguous = r == Py_True;
                Py_DECREF(r);
                if (!contiguous) return slow_path(self, args, nargs);
                PyObject* mem = PyObject_GetAttr(a, s_data);
                if (mem == NULL) return slow_path(self, args, nargs);
                r = PyObject_GetAttr(mem, s_device_id);
                if (r == NULL) { Py_DECREF(mem); return slow_path(self, args, nargs); }
                d = PyLong_AsLong(r);
                Py_DECREF(r);
                r = PyObject_GetAttr(mem, s_ptr);
                Py_DECREF(mem);
                if (r == NULL) return slow_path(self, args, nargs);
                p = PyLong_AsUnsignedLongLong(r);
                Py_DECREF(r);
                if (d < 0 || d >= MAXDEV || (dev >= 0 && d != dev)) return slow_path(self, args, nargs);
            } else {
                return slow_path(self, args, nargs);
            }
            if (p == (unsigned long long)-1 && PyErr_Occurred()) return slow_path(self, args, nargs);
            dev = (int)d;
            vals[i] = (uint64_t)p;
        } else if (kind == K_F32 || kind == K_F64 || kind == K_F16) {
            double v;
            if (PyFloat_CheckExact(a)) v = PyFloat_AS_DOUBLE(a);
            else if (PyLong_CheckExact(a)) {
                v = PyLong_AsDouble(a);
                if (v == -1.0 && PyErr_Occurred()) return slow_path(self, args, nargs);
            } else return slow_path(self, args, nargs);
            if (kind == K_F32) {
                float f = (float)v;
                if (isinf(f) && !isinf(v)) return slow_path(self, args, nargs);
                uint32_t bits; memcpy(&bits, &f, 4); vals[i] = bits;
            } else if (kind == K_F64) {
                memcpy(&vals[i], &v, 8);
            } else {
                unsigned char h[2];
#if PY_VERSION_HEX >= 0x030B0000
                if (PyFloat_Pack2(v, (char*)h, 1) < 0) return slow_path(self, args, nargs);
#else
                if (_PyFloat_Pack2(v, h, 1) < 0) return slow_path(self, args, nargs);
#endif
                vals[i] = (uint64_t)h[0] | ((uint64_t)h[1] << 8);
            }
        } else {
            if (!PyLong_CheckExact(a)) return slow_path(self, args, nargs);
            if (kind == K_U64) {
                unsigned long long u = PyLong_AsUnsignedLongLong(a);
                if (u == (unsigned long long)-1 && PyErr_Occurred()) return slow_path(self, args, nargs);
                vals[i] = u;
            } else {
                int overflow = 0;
                long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
                if (overflow || (v == -1 && PyErr_Occurred())) return slow_path(self, args, nargs);
                long long lo, hi;
                switch (kind) {
                    case K_I8: lo = -128; hi = 127; break;
                    case K_U8: lo = 0; hi = 255; break;
                    case K_I16: lo = -32768; hi = 32767; break;
                    case K_U16: lo = 0; hi = 65535; break;
                    case K_I32: lo = -2147483648LL; hi = 2147483647LL; break;
                    case K_U32: lo = 0; hi = 4294967295LL; break;
                    default: lo = LLONG_MIN; hi = LLONG_MAX; break;
                }
                if (v < lo || v > hi) return slow_path(self, args, nargs);
                vals[i] = (uint64_t)v;
            }
        }
    }
    if (dev < 0 || frameworks == 3 || st->funcs[dev] == NULL || self->check > st->shm_ok[dev])
        return slow_path(self, args, nargs);
    if (st->check_device) {
        PyObject* r = PyObject_CallNoArgs(frameworks == 1 ? st->cur_dev : st->cupy_cur_dev);
        if (r == NULL) return slow_path(self, args, nargs);
        long c = PyLong_AsLong(r);
        Py_DECREF(r);
        if (c != dev) return slow_path(self, args, nargs);
    }
    void* stream = self->stream;
    if (self->default_stream && frameworks == 1 && st->t_stream != NULL) {
        if (st->t_stream((int32_t)dev, &stream) != 0) return slow_path(self, args, nargs);
    } else if (self->default_stream) {
        PyObject* r;
        if (frameworks == 1) {
            PyObject* d = PyLong_FromLong(dev);
            r = d ? PyObject_CallOneArg(st->raw_stream, d) : NULL;
            Py_XDECREF(d);
        } else {
            r = PyObject_CallNoArgs(st->cupy_stream);
        }
        if (r == NULL) return slow_path(self, args, nargs);
        stream = PyLong_AsVoidPtr(r);
        Py_DECREF(r);
        if (stream == NULL && PyErr_Occurred()) return slow_path(self, args, nargs);
    }
    /* 2. write the buffer and launch: no Python code runs from here to the driver's return */
    char* buf = st->buf;
    for (int i = 0; i < st->n; i++) {
        char* slot = buf + st->offsets[i];
        switch (st->kinds[i]) {
            case K_PTR: case K_F64: case K_I64: case K_U64: memcpy(slot, &vals[i], 8); break;
            case K_F32: case K_I32: case K_U32: { uint32_t v = (uint32_t)vals[i]; memcpy(slot, &v, 4); break; }
            case K_F16: case K_I16: case K_U16: { uint16_t v = (uint16_t)vals[i]; memcpy(slot, &v, 2); break; }
            default: { uint8_t v = (uint8_t)vals[i]; memcpy(slot, &v, 1); break; }
        }
    }
    int code;
    if (st->launch_ex != NULL) {  /* the GIL is held: the launcher's config is ours until return */
        self->lc.hStream = stream;
        code = st->launch_ex(&self->lc, st->funcs[dev], st->params, NULL);
    } else {
        code = st->launch(st->funcs[dev], self->g[0], self->g[1], self->g[2], self->b[0],
                          self->b[1], self->b[2], self->shmem, stream, st->params, NULL);
    }
    if (code != 0) {
        PyObject* t = args_tuple(args, nargs);
        if (!t) return NULL;
        PyObject* r = PyObject_CallFunction(st->fail, "iOO", code, self->cfg, t);
        Py_DECREF(t);
        return r;
    }
    Py_RETURN_NONE;
}

/* Launcher(state, cfg, gx, gy, gz, bx, by, bz, shmem, check, stream_or_None) */
static PyObject* Launcher_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
    PyObject *st, *cfg, *stream;
    unsigned gx, gy, gz, bx, by, bz, shmem;
    long long check;
    if (!PyArg_ParseTuple(args, "O!OIIIIIIILO", &StateType, &st, &cfg, &gx, &gy, &gz, &bx, &by, &bz,
                          &shmem, &check, &stream))
        return NULL;
    Launcher* self = (Launcher*)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = Launcher_vectorcall;
    Py_INCREF(st); self->st = (State*)st;
    Py_INCREF(cfg); self->cfg = cfg;
    self->g[0] = gx; self->g[1] = gy; self->g[2] = gz;
    self->b[0] = bx; self->b[1] = by; self->b[2] = bz;
    self->shmem = shmem;
    self->check = check;
    launch_config_t lc = {gx, gy, gz, bx, by, bz, shmem, NULL, NULL, 0};
    self->lc = lc;
    if (stream == Py_None) { self->default_stream = 1; self->stream = NULL; }
    else {
        self->default_stream = 0;
        self->stream = PyLong_AsVoidPtr(stream);
        if (PyErr_Occurred()) { Py_DECREF(self); return NULL; }
    }
    return (PyObject*)self;
}

static PyTypeObject LauncherType = {PyVarObject_HEAD_INIT(NULL, 0)};

/* Subscript(attr, slow): a class's __getitem__ that looks the key up in the instance's dict
   attribute `attr` (Kernel._configs: launch configuration -> launcher) and returns the hit
   without running Python code; a miss (or an unhashable key) calls slow(obj, key). A method
   descriptor: the type slot calls it with (obj, key), no bound method is made. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject* attr;
    PyObject* slow;
} Subscript;

static int Subscript_traverse(Subscript* self, visitproc visit, void* arg) {
    Py_VISIT(self->slow);
    return 0;
}

static int Subscript_clear(Subscript* self) {
    Py_CLEAR(self->attr);
    Py_CLEAR(self->slow);
    return 0;
}

static void Subscript_dealloc(Subscript* self) {
    PyObject_GC_UnTrack(self);
    Subscript_clear(self);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* Subscript_vectorcall(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    Subscript* self = (Subscript*)op;
    if (self->slow == NULL) { PyErr_SetString(PyExc_RuntimeError, "Subscript was cleared"); return NULL; }
    if (PyVectorcall_NARGS(nargsf) == 2 && kwnames == NULL) {
        PyObject* d = PyObject_GetAttr(args[0], self->attr);
        if (d != NULL) {
            PyObject* r = PyDict_CheckExact(d) ? PyDict_GetItemWithError(d, args[1]) : NULL;
            Py_XINCREF(r);
            Py_DECREF(d);
            if (r != NULL) return r;
        }
        if (PyErr_Occurred()) PyErr_Clear();  /* unhashable, no dict: the slow path says */
    }
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

static PyObject* Subscript_get(PyObject* self, PyObject* obj, PyObject* type) {
    if (obj == NULL || obj == Py_None) { Py_INCREF(self); return self; }
    return PyMethod_New(self, obj);
}

static PyObject* Subscript_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
    PyObject *attr, *slow;
    if (!PyArg_ParseTuple(args, "UO", &attr, &slow)) return NULL;
    Subscript* self = (Subscript*)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = Subscript_vectorcall;
    Py_INCREF(attr);
    PyUnicode_InternInPlace(&attr);
    self->attr = attr;
    Py_INCREF(slow); self->slow = slow;
    return (PyObject*)self;
}

static PyTypeObject SubscriptType = {PyVarObject_HEAD_INIT(NULL, 0)};

/* JitDispatch(binders, optional, table, full, cfg, resolve): the launcher cuforge.jit's
   `k[grid, block]` returns when this extension is loaded (cuforge/jitkernel.py,
   JitKernel._build_fast_path; the generated Python `launch` there does the same). A call
   reads `.dtype` of each binding argument (`binders`: argument indices; `optional`: a
   scalar binder, whose missing `.dtype` reads as None), looks the tuple up in `table`
   (dtypes -> (keywords dict, executor launcher)), compares the call's keywords with that
   dict (dict ==), and on a hit vectorcalls the executor's launcher with the positional
   arguments: no tuple or dict is built for the call. Anything else (a miss, an unhashable
   dtype, an argument short, an error while reading) calls
   resolve(table, full, cfg, args_tuple, kwargs_dict), the Python general path, which
   checks everything and fills the tables. set_torch(Tensor, offset, get_dtype, dtypes) reads
   an exact torch.Tensor's dtype through torch's C shim (aoti_torch_get_dtype on the
   at::Tensor at offset; dtypes[code] is the torch.dtype of that code), as the launcher does,
   instead of calling the `dtype` getter. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int nb;
    Py_ssize_t idx[MAXP];
    char optional[MAXP];
    PyObject* table;
    PyObject* full;
    PyObject* cfg;
    PyObject* resolve;
    PyObject* t_type;    /* torch.Tensor, when set_torch was called */
    Py_ssize_t t_off;
    t_i32_t t_get_dtype;
    PyObject* t_dtypes;  /* tuple: shim dtype code -> torch.dtype (None: unknown) */
} JitDispatch;

static int JitDispatch_traverse(JitDispatch* self, visitproc visit, void* arg) {
    Py_VISIT(self->table);
    Py_VISIT(self->full);
    Py_VISIT(self->cfg);
    Py_VISIT(self->resolve);
    Py_VISIT(self->t_type);
    Py_VISIT(self->t_dtypes);
    return 0;
}

static int JitDispatch_clear(JitDispatch* self) {
    Py_CLEAR(self->table);
    Py_CLEAR(self->full);
    Py_CLEAR(self->cfg);
    Py_CLEAR(self->resolve);
    Py_CLEAR(self->t_type);
    Py_CLEAR(self->t_dtypes);
    return 0;
}

static void JitDispatch_dealloc(JitDispatch* self) {
    PyObject_GC_UnTrack(self);
    JitDispatch_clear(self);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* jit_miss(JitDispatch* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    if (PyErr_Occurred()) PyErr_Clear();  /* the general path reads again and says */
    PyObject* t = args_tuple(args, nargs);
    if (!t) return NULL;
    PyObject* kw = PyDict_New();
    if (!kw) { Py_DECREF(t); return NULL; }
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < nkw; j++) {
        if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, j), args[nargs + j]) < 0) {
            Py_DECREF(t); Py_DECREF(kw); return NULL;
        }
    }
    PyObject* r = PyObject_CallFunctionObjArgs(self->resolve, self->table, self->full, self->cfg, t, kw, NULL);
    Py_DECREF(t);
    Py_DECREF(kw);
    return r;
}

/* the torch.dtype of an exact torch.Tensor through the shim (borrowed), or NULL: unknown */
static inline PyObject* jit_torch_dtype(JitDispatch* self, PyObject* a) {
    int32_t code;
    if (self->t_get_dtype((char*)a + self->t_off, &code) != 0 || code < 0 ||
        code >= PyTuple_GET_SIZE(self->t_dtypes))
        return NULL;
    PyObject* d = PyTuple_GET_ITEM(self->t_dtypes, code);
    return d == Py_None ? NULL : d;
}

static PyObject* JitDispatch_vectorcall(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    JitDispatch* self = (JitDispatch*)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->resolve == NULL || self->table == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "JitDispatch was cleared");
        return NULL;
    }
    PyObject* key = PyTuple_New(self->nb);
    if (!key) return NULL;
    for (int b = 0; b < self->nb; b++) {
        Py_ssize_t i = self->idx[b];
        if (i >= nargs) { Py_DECREF(key); return jit_miss(self, args, nargs, kwnames); }
        PyObject* a = args[i];
        PyObject* d;
        if (self->optional[b] && (PyFloat_CheckExact(a) || PyLong_CheckExact(a) || PyBool_Check(a))) {
            d = Py_None;  /* a Python number has no .dtype */
            Py_INCREF(d);
        } else if (self->t_type != NULL && (PyObject*)Py_TYPE(a) == self->t_type &&
                   (d = jit_torch_dtype(self, a)) != NULL) {
            Py_INCREF(d);
        } else {
            d = PyObject_GetAttr(a, s_dtype);
            if (d == NULL) {
                if (!self->optional[b] || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
                    Py_DECREF(key);
                    return jit_miss(self, args, nargs, kwnames);
                }
                PyErr_Clear();
                d = Py_None;
                Py_INCREF(d);
            }
        }
        PyTuple_SET_ITEM(key, b, d);
    }
    PyObject* v = PyDict_GetItemWithError(self->table, key);  /* borrowed */
    Py_DECREF(key);
    if (v == NULL || !PyTuple_CheckExact(v) || PyTuple_GET_SIZE(v) != 2 ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(v, 0)))
        return jit_miss(self, args, nargs, kwnames);
    Py_INCREF(v);  /* a keyword's __eq__ may run Python code that edits the table */
    PyObject* kwd = PyTuple_GET_ITEM(v, 0);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int same = PyDict_GET_SIZE(kwd) == nkw;
    for (Py_ssize_t j = 0; same && j < nkw; j++) {
        PyObject* have = PyDict_GetItemWithError(kwd, PyTuple_GET_ITEM(kwnames, j));
        PyObject* given = args[nargs + j];
        if (have == NULL) same = 0;
        else if (have != given) {
            Py_INCREF(have);
            same = PyObject_RichCompareBool(have, given, Py_EQ) == 1;
            Py_DECREF(have);
        }
    }
    if (!same) { Py_DECREF(v); return jit_miss(self, args, nargs, kwnames); }
    PyObject* r = PyObject_Vectorcall(PyTuple_GET_ITEM(v, 1), args, nargs, NULL);
    Py_DECREF(v);
    return r;
}

static PyObject* JitDispatch_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
    PyObject *binders, *optional, *table, *full, *cfg, *resolve;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OO", &PyTuple_Type, &binders, &PyTuple_Type, &optional,
                          &PyDict_Type, &table, &PyDict_Type, &full, &cfg, &resolve))
        return NULL;
    Py_ssize_t nb = PyTuple_GET_SIZE(binders);
    if (nb > MAXP || PyTuple_GET_SIZE(optional) != nb) {
        PyErr_SetString(PyExc_ValueError, "JitDispatch: at most 64 binders, one flag each");
        return NULL;
    }
    JitDispatch* self = (JitDispatch*)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = JitDispatch_vectorcall;
    self->nb = (int)nb;
    for (Py_ssize_t b = 0; b < nb; b++) {
        self->idx[b] = PyLong_AsSsize_t(PyTuple_GET_ITEM(binders, b));
        self->optional[b] = (char)PyObject_IsTrue(PyTuple_GET_ITEM(optional, b));
        if (PyErr_Occurred() || self->idx[b] < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "JitDispatch: a negative index");
            Py_DECREF(self);
            return NULL;
        }
    }
    Py_INCREF(table); self->table = table;
    Py_INCREF(full); self->full = full;
    Py_INCREF(cfg); self->cfg = cfg;
    Py_INCREF(resolve); self->resolve = resolve;
    return (PyObject*)self;
}

static PyObject* JitDispatch_get_table(JitDispatch* self, void* unused) {
    PyObject* t = self->table ? self->table : Py_None;
    Py_INCREF(t);
    return t;
}

static PyObject* JitDispatch_get_full(JitDispatch* self, void* unused) {
    PyObject* t = self->full ? self->full : Py_None;
    Py_INCREF(t);
    return t;
}

static PyObject* JitDispatch_get_cfg(JitDispatch* self, void* unused) {
    PyObject* t = self->cfg ? self->cfg : Py_None;
    Py_INCREF(t);
    return t;
}

/* set_torch(Tensor, offset, get_dtype_addr, dtypes_by_code) */
static PyObject* JitDispatch_set_torch(JitDispatch* self, PyObject* args) {
    PyObject *type, *dtypes;
    Py_ssize_t off;
    unsigned long long fn;
    if (!PyArg_ParseTuple(args, "OnKO!", &type, &off, &fn, &PyTuple_Type, &dtypes)) return NULL;
    if (fn == 0 || off < (Py_ssize_t)sizeof(PyObject) || !PyType_Check(type) ||
        off + (Py_ssize_t)sizeof(void*) > ((PyTypeObject*)type)->tp_basicsize) {
        PyErr_SetString(PyExc_ValueError, "set_torch: a null shim address, or the offset is outside the object");
        return NULL;
    }
    Py_CLEAR(self->t_type);  /* off while the fields change */
    self->t_off = off;
    self->t_get_dtype = (t_i32_t)(uintptr_t)fn;
    REPLACE(self->t_dtypes, dtypes);
    REPLACE(self->t_type, type);
    Py_RETURN_NONE;
}

static PyMethodDef JitDispatch_methods[] = {
    {"set_torch", (PyCFunction)JitDispatch_set_torch, METH_VARARGS,
     "read exact torch.Tensor dtypes through torch's C shim"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef JitDispatch_getset[] = {
    {"table", (getter)JitDispatch_get_table, NULL, "dtypes -> (keywords, launcher)", NULL},
    {"full", (getter)JitDispatch_get_full, NULL, "(*dtypes, *keyword items) -> executor", NULL},
    {"config", (getter)JitDispatch_get_cfg, NULL, "the launch configuration", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject JitDispatchType = {PyVarObject_HEAD_INIT(NULL, 0)};

/* torch_abi_probe(offset, fns, obj) -> (dtype, device_type, device_index, contiguous, data_ptr)
   as the launcher reads them; fastpath.torch_abi() compares them with the tensor's methods */
static PyObject* torch_abi_probe(PyObject* mod, PyObject* args) {
    Py_ssize_t off;
    PyObject *fns, *obj;
    if (!PyArg_ParseTuple(args, "nOO", &off, &fns, &obj)) return NULL;
    t_i32_t f[5];
    if (abi_fns(fns, f) < 0) return NULL;
    if (off < (Py_ssize_t)sizeof(PyObject) ||
        (Py_TYPE(obj)->tp_itemsize == 0 && off + (Py_ssize_t)sizeof(void*) > Py_TYPE(obj)->tp_basicsize)) {
        PyErr_SetString(PyExc_ValueError, "torch_abi_probe: the offset is outside the object");
        return NULL;
    }
    void* h = (char*)obj + off;
    int32_t dt, ty, ix;
    _Bool c;
    void* p;
    if (f[0](h, &dt) || f[1](h, &ty) || f[2](h, &ix) || ((t_bool_t)f[3])(h, &c) || ((t_ptr_t)f[4])(h, &p)) {
        PyErr_SetString(PyExc_RuntimeError, "a torch shim call failed");
        return NULL;
    }
    return Py_BuildValue("iiiOK", (int)dt, (int)ty, (int)ix, c ? Py_True : Py_False,
                         (unsigned long long)(uintptr_t)p);
}

static PyMethodDef mod_methods[] = {
    {"torch_abi_probe", torch_abi_probe, METH_VARARGS, "read a tensor through torch's C shim"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_cuforge_fastlaunch", NULL, -1, mod_methods};

PyMODINIT_FUNC PyInit__cuforge_fastlaunch(void) {
    s_dtype = PyUnicode_InternFromString("dtype");
    s_c_contiguous = PyUnicode_InternFromString("_c_contiguous");
    s_data = PyUnicode_InternFromString("data");
    s_ptr = PyUnicode_InternFromString("ptr");
    s_device_id = PyUnicode_InternFromString("device_id");
    StateType.tp_name = "_cuforge_fastlaunch.State";
    StateType.tp_basicsize = sizeof(State);
    StateType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
    StateType.tp_traverse = (traverseproc)State_traverse;
    StateType.tp_clear = (inquiry)State_clear;
    StateType.tp_new = PyType_GenericNew;
    StateType.tp_init = (initproc)State_init;
    StateType.tp_dealloc = (destructor)State_dealloc;
    StateType.tp_methods = State_methods;
    LauncherType.tp_name = "_cuforge_fastlaunch.Launcher";
    LauncherType.tp_basicsize = sizeof(Launcher);
    LauncherType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC;
    LauncherType.tp_traverse = (traverseproc)Launcher_traverse;
    LauncherType.tp_clear = (inquiry)Launcher_clear;
    LauncherType.tp_vectorcall_offset = offsetof(Launcher, vectorcall);
    LauncherType.tp_call = PyVectorcall_Call;
    LauncherType.tp_new = Launcher_new;
    LauncherType.tp_dealloc = (destructor)Launcher_dealloc;
    SubscriptType.tp_name = "_cuforge_fastlaunch.Subscript";
    SubscriptType.tp_basicsize = sizeof(Subscript);
    SubscriptType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC |
                             Py_TPFLAGS_METHOD_DESCRIPTOR;
    SubscriptType.tp_traverse = (traverseproc)Subscript_traverse;
    SubscriptType.tp_clear = (inquiry)Subscript_clear;
    SubscriptType.tp_vectorcall_offset = offsetof(Subscript, vectorcall);
    SubscriptType.tp_call = PyVectorcall_Call;
    SubscriptType.tp_descr_get = Subscript_get;
    SubscriptType.tp_new = Subscript_new;
    SubscriptType.tp_dealloc = (destructor)Subscript_dealloc;
    JitDispatchType.tp_name = "_cuforge_fastlaunch.JitDispatch";
    JitDispatchType.tp_basicsize = sizeof(JitDispatch);
    JitDispatchType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC;
    JitDispatchType.tp_traverse = (traverseproc)JitDispatch_traverse;
    JitDispatchType.tp_clear = (inquiry)JitDispatch_clear;
    JitDispatchType.tp_vectorcall_offset = offsetof(JitDispatch, vectorcall);
    JitDispatchType.tp_call = PyVectorcall_Call;
    JitDispatchType.tp_new = JitDispatch_new;
    JitDispatchType.tp_dealloc = (destructor)JitDispatch_dealloc;
    JitDispatchType.tp_getset = JitDispatch_getset;
    JitDispatchType.tp_methods = JitDispatch_methods;
    if (PyType_Ready(&StateType) < 0 || PyType_Ready(&LauncherType) < 0 ||
        PyType_Ready(&SubscriptType) < 0 || PyType_Ready(&JitDispatchType) < 0)
        return NULL;
    PyObject* m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&StateType);
    Py_INCREF(&LauncherType);
    PyModule_AddObject(m, "State", (PyObject*)&StateType);
    PyModule_AddObject(m, "Launcher", (PyObject*)&LauncherType);
    Py_INCREF(&SubscriptType);
    PyModule_AddObject(m, "Subscript", (PyObject*)&SubscriptType);
    Py_INCREF(&JitDispatchType);
    PyModule_AddObject(m, "JitDispatch", (PyObject*)&JitDispatchType);
    return m;
}
