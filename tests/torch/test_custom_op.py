"""``cuforge.torch.custom_op`` on a machine without a GPU: schema derivation from real
compiled kernels, registration with torch.library, the fake implementation under
FakeTensorMode / ``torch.library.opcheck`` on meta tensors, ``torch.compile(fullgraph=True)``
tracing with no graph break, and the errors.

The launch itself needs a GPU (tests/torch/test_custom_op_gpu.py). The plumbing around it
-- which kernel argument gets which value, outputs allocated, grids computed -- is checked
here by registering a kernel-mode op for the CPU with a recording stand-in for the launch.
"""

from __future__ import annotations

import uuid

import pytest

torch = pytest.importorskip("torch")

import cuforge  # noqa: E402
from cuforge.torch import CustomOpError, custom_op, derive_schema  # noqa: E402

SOURCE = r"""
#include <cuda_fp16.h>
struct Pair { int a; int b; };

extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
// extension-cpp's kernel, as written there
extern "C" __global__ void muladd(int numel, const float* a, const float* b, float c,
                                  float* result) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < numel) result[i] = a[i] * b[i] + c;
}
extern "C" __global__ void sin_cos(const float* x, float* s, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { s[i] = sinf(x[i]); c[i] = cosf(x[i]); }
}
extern "C" __global__ void kinds(float const* in, double* d, bool flag, __half h, double g,
                                 unsigned long long q, short s, void* raw, float* const p) {}
extern "C" __global__ void takes_struct(float* y, Pair p) {}
"""


@pytest.fixture
def prog():
    """The test kernels, compiled (explicit arch: there is no GPU to ask) or a cache hit."""
    return cuforge.compile(SOURCE, name="custom_op_test.cu", arch="sm_90")


def qual(name: str) -> str:
    """A fresh namespace per registration: ops live for the whole process."""
    return f"cuforge_test_{uuid.uuid4().hex[:10]}::{name}"


def op_of(qualname: str):
    ns, name = qualname.split("::")
    return getattr(getattr(torch.ops, ns), name).default


# -- schema derivation ----------------------------------------------------------------------


def test_schema_in_place(prog):
    k = prog.kernel("saxpy")
    assert (
        derive_schema(k, mutates_args=("y",)) == "(Tensor(a!) y, Tensor x, float a, SymInt n) -> ()"
    )


def test_schema_outputs_are_returned_not_taken(prog):
    k = prog.kernel("muladd")
    assert (
        derive_schema(k, outputs=("result",))
        == "(SymInt numel, Tensor a, Tensor b, float c) -> Tensor"
    )
    assert (
        derive_schema(prog.kernel("sin_cos"), outputs=("s", "c"))
        == "(Tensor x, SymInt n) -> (Tensor, Tensor)"
    )


def test_schema_every_scalar_kind_and_const_spellings(prog):
    k = prog.kernel("kinds")
    # float const* is const; float* const is a const pointer to writable floats
    assert derive_schema(k, mutates_args=("d", "raw", "p")) == (
        "(Tensor in_, Tensor(a!) d, bool flag, float h, float g, SymInt q, SymInt s, "
        "Tensor(b!) raw, Tensor(c!) p) -> ()"
    )
    with pytest.raises(CustomOpError, match=r"'in_'.*float const\*.*pointer to const"):
        derive_schema(k, mutates_args=("in_",))


def test_schema_errors_name_the_parameter(prog):
    with pytest.raises(CustomOpError, match=r"parameter 'p' \(Pair.*struct.*Python function"):
        derive_schema(prog.kernel("takes_struct"), mutates_args=("y",))
    saxpy = prog.kernel("saxpy")
    with pytest.raises(CustomOpError, match=r"const float\*.*cannot write.*remove 'x'"):
        derive_schema(saxpy, mutates_args=("x",))
    with pytest.raises(CustomOpError, match=r"'z', which is not a parameter.*y \(float\*\)"):
        derive_schema(saxpy, outputs=("z",))
    with pytest.raises(CustomOpError, match=r"'n', a int scalar.*only pointer"):
        derive_schema(saxpy, outputs=("n",))
    with pytest.raises(CustomOpError, match=r"both outputs and mutates_args"):
        derive_schema(saxpy, outputs=("y",), mutates_args=("y",))
    with pytest.raises(CustomOpError, match=r"names an argument twice"):
        derive_schema(saxpy, mutates_args=("y", "y"))


# -- registration and the fake ------------------------------------------------------------


def test_kernel_op_registered_with_derived_schema(prog):
    q = qual("muladd")
    op = custom_op(
        q,
        prog.kernel("muladd"),
        outputs=("result",),
        out_like="a",
        grid=lambda numel, a, b, c, result: (numel + 255) // 256,
        block=256,
    )
    overload = op_of(q)
    assert str(overload._schema) == f"{q}(SymInt numel, Tensor a, Tensor b, float c) -> Tensor"
    # the fake on fake CUDA tensors: shape, dtype, device, contiguous
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(4, 5, device="cuda").t()  # non-contiguous input
        out = op(20, a, a, 2.0)
        assert isinstance(out, FakeTensor)
        assert out.shape == (5, 4) and out.dtype == torch.float32
        assert out.device.type == "cuda" and out.is_contiguous()


def test_opcheck_on_meta_tensors(prog):
    a = torch.empty(64, device="meta")
    q = qual("muladd")
    op = custom_op(q, prog.kernel("muladd"), outputs=("result",), out_like="a", grid=1, block=256)
    results = torch.library.opcheck(op, (64, a, a.clone(), 0.5))
    assert set(results.values()) == {"SUCCESS"}, results

    q2 = qual("saxpy")
    op2 = custom_op(q2, prog.kernel("saxpy"), mutates_args=("y",), grid=1, block=256)
    results = torch.library.opcheck(op2, (a.clone(), a.clone(), 2.0, 64))
    assert set(results.values()) == {"SUCCESS"}, results
    assert op2(a.clone(), a, 2.0, 64) is None


def test_launcher_schema_from_type_hints_and_decorator_form():
    q = qual("mymuladd")

    @custom_op(q, out_like="a")
    def mymuladd(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
        raise AssertionError("the CUDA implementation does not run on meta tensors")

    assert str(op_of(q)._schema) == f"{q}(Tensor a, Tensor b, float c) -> Tensor"
    x = torch.empty(3, 7, device="meta", dtype=torch.float16)
    out = mymuladd(x, x, 1.0)
    assert out.shape == (3, 7) and out.dtype == torch.float16 and out.device.type == "meta"
    results = torch.library.opcheck(mymuladd, (x, x.clone(), 1.0))
    assert set(results.values()) == {"SUCCESS"}, results


def test_launcher_hints_naming_a_locally_imported_tensor():
    # this file uses `from __future__ import annotations`: the hints are the strings
    # 'Tensor' and 'float', and Tensor is imported here, not at module level
    from torch import Tensor

    q = qual("local")

    @custom_op(q, out_like="a")
    def local(a: Tensor, c: float) -> Tensor:
        return torch.empty_like(a)

    assert str(op_of(q)._schema) == f"{q}(Tensor a, float c) -> Tensor"

    def unknown(a: NoSuchType) -> Tensor:  # noqa: F821 - the error under test
        return a

    with pytest.raises(CustomOpError, match=r"type hints of launcher.*NoSuchType"):
        custom_op(qual("u"), unknown, out_like="a")


def test_launcher_with_fake_and_explicit_schema():
    q = qual("split")

    def split(x, n):
        raise AssertionError("not on meta")

    op = custom_op(
        q,
        split,
        schema="(Tensor x, SymInt n) -> (Tensor, Tensor)",
        fake=lambda x, n: (x.new_empty(n), x.new_empty(x.numel() - n)),
    )
    first, second = op(torch.empty(10, device="meta"), 3)
    assert first.shape == (3,) and second.shape == (7,)


def test_mutating_launcher_gets_a_fake_returning_none():
    q = qual("fill")

    def fill(out: torch.Tensor, value: float) -> None:
        raise AssertionError("not on meta")

    op = custom_op(q, fill, mutates_args=("out",))
    schema = str(op_of(q)._schema)
    assert schema.startswith(f"{q}(Tensor(a") and schema.endswith("!) out, float value) -> ()")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert op(torch.empty(3, device="cuda"), 1.0) is None


def test_module_import_order_does_not_shadow_the_function():
    import importlib

    importlib.import_module("cuforge.torch.custom_ops")
    import cuforge.torch as ct

    assert callable(ct.custom_op) and ct.custom_op is custom_op


# -- torch.compile ------------------------------------------------------------------------


def _compile_and_count(fn, *args):
    """Run fn under torch.compile(fullgraph=True) and return (result, the FX graphs)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    result = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    return result, graphs


def test_compile_fullgraph_out_of_place_kernel_op(prog):
    q = qual("muladd")
    op = custom_op(
        q,
        prog.kernel("muladd"),
        outputs=("result",),
        out_like="a",
        grid=lambda numel, a, b, c, result: (numel + 255) // 256,
        block=256,
    )

    def f(a, b):
        return op(a.numel(), a, b, 3.0).relu() * 2

    a = torch.empty(16, 8, device="meta")
    out, graphs = _compile_and_count(f, a, a.clone())
    assert out.shape == (16, 8)
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert op_of(q) in targets


def test_compile_fullgraph_in_place_kernel_op_through_aot(prog):
    q = qual("saxpy")
    op = custom_op(q, prog.kernel("saxpy"), mutates_args=("y",), grid=1, block=256)

    def f(y, x):
        op(y, x, 2.0, y.numel())
        return y + 1

    torch._dynamo.reset()
    y = torch.empty(32, device="meta")
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(y, y.clone())
    assert out.shape == (32,)
    explained = torch._dynamo.explain(f)(y, y.clone())
    assert explained.graph_break_count == 0, explained.break_reasons


# -- what the CUDA implementation does (recorded, registered for the CPU) -----------------


class RecordingKernel:
    """Has a real kernel's parameters; records launches instead of making them (there is
    no GPU here). The real launch is covered by test_custom_op_gpu.py."""

    def __init__(self, kernel) -> None:
        self.params = kernel.params
        self.program = kernel.program
        self.name = kernel.name
        self.launches: list = []

    def __getitem__(self, config):
        def launch(*args):
            self.launches.append((config, args))

        return launch


def test_kernel_impl_argument_plumbing(prog):
    rec = RecordingKernel(prog.kernel("muladd"))
    seen = []

    def grid(numel, a, b, c, result):
        seen.append((numel, c, result.shape))
        return (numel + 127) // 128

    op = custom_op(
        qual("muladd"),
        rec,
        outputs=("result",),
        out_like="a",
        grid=grid,
        block=128,
        device_types="cpu",
    )
    a = torch.arange(300, dtype=torch.float32)
    b = torch.ones(300)
    out = op(300, a, b, 1.5)
    assert out.shape == (300,) and out.dtype == torch.float32
    ((config, args),) = rec.launches
    assert config == (3, 128, 0)
    assert args[0] == 300 and args[1] is a and args[2] is b and args[3] == 1.5
    assert args[4] is out  # the allocated output is passed where the kernel writes it
    assert seen == [(300, 1.5, (300,))]


def test_kernel_impl_makes_read_only_inputs_contiguous_and_skips_empty_grids(prog):
    rec = RecordingKernel(prog.kernel("saxpy"))
    op = custom_op(
        qual("saxpy"),
        rec,
        mutates_args=("y",),
        grid=lambda y, x, a, n: (n + 255) // 256,
        block=256,
        device_types="cpu",
    )
    y = torch.zeros(4, 4)
    x = torch.ones(4, 4).t()  # read-only, non-contiguous
    op(y, x, 2.0, 16)
    ((config, args),) = rec.launches
    assert args[0] is y and args[1].is_contiguous() and torch.equal(args[1], x)
    rec.launches.clear()
    op(torch.zeros(0), torch.zeros(0), 2.0, 0)  # grid 0: nothing to launch
    assert rec.launches == []


def test_fixed_grid_and_multiple_outputs(prog):
    rec = RecordingKernel(prog.kernel("sin_cos"))
    op = custom_op(
        qual("sin_cos"),
        rec,
        outputs=("s", "c"),
        out_like=("x", "x"),
        grid=(2, 1),
        block=(64, 1, 1),
        shared_mem=128,
        device_types="cpu",
    )
    x = torch.zeros(100)
    s, c = op(x, 100)
    ((config, args),) = rec.launches
    assert config == ((2, 1), (64, 1, 1), 128)
    assert args[0] is x and args[1] is s and args[2] is c and args[3] == 100


# -- errors for people ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "qualname, match",
    [
        ("saxpy", r"exactly one '::'"),
        ("a::b::c", r"exactly one '::'"),
        ("::saxpy", r"exactly one '::'"),
        ("my-lib::saxpy", r"namespace 'my-lib'.*identifier"),
        ("mylib::sax.py", r"name 'sax.py'.*identifier"),
        ("aten::saxpy", r"'aten' belongs to torch"),
        (42, r"must be a string"),
    ],
)
def test_bad_qualname(prog, qualname, match):
    with pytest.raises(CustomOpError, match=match):
        custom_op(qualname, prog.kernel("saxpy"), mutates_args=("y",), grid=1, block=1)
    with pytest.raises(CustomOpError, match=match):
        custom_op(qualname, mutates_args=("y",))  # the decorator form checks at once


def test_schema_that_does_not_match_the_kernel(prog):
    k = prog.kernel("saxpy")
    kw = {"mutates_args": ("y",), "grid": 1, "block": 256}
    derived = (
        r"derived from the kernel is '\(Tensor\(a!\) y, Tensor x, float a, SymInt n\) -> \(\)'"
    )
    with pytest.raises(
        CustomOpError, match=r"has 3 arguments but kernel 'saxpy' takes 4.*" + derived
    ):
        custom_op(qual("s"), k, schema="(Tensor(a!) y, Tensor x, float a) -> ()", **kw)
    with pytest.raises(CustomOpError, match=r"argument 2 'a' is Tensor.*'a' is float.*needs float"):
        custom_op(qual("s"), k, schema="(Tensor(a!) y, Tensor x, Tensor a, SymInt n) -> ()", **kw)
    with pytest.raises(CustomOpError, match=r"argument 3 'n' is float.*int.*needs SymInt"):
        custom_op(qual("s"), k, schema="(Tensor(a!) y, Tensor x, float a, float n) -> ()", **kw)
    with pytest.raises(CustomOpError, match=r"named 'out' but kernel 'saxpy' calls.*'y'"):
        custom_op(qual("s"), k, schema="(Tensor(a!) out, Tensor x, float a, int n) -> ()", **kw)
    with pytest.raises(CustomOpError, match=r"returns 1 value.*returns 0 tensor"):
        custom_op(qual("s"), k, schema="(Tensor(a!) y, Tensor x, float a, int n) -> Tensor", **kw)
    with pytest.raises(CustomOpError, match=r"marks \[\] as written.*mutates_args is \['y'\]"):
        custom_op(qual("s"), k, schema="(Tensor y, Tensor x, float a, int n) -> ()", **kw)
    with pytest.raises(CustomOpError, match=r"torch cannot parse schema"):
        custom_op(qual("s"), k, schema="(Tensor y, Tensor x,, float a) -> ()", **kw)
    # a matching explicit schema (int instead of SymInt) is accepted
    op = custom_op(qual("s"), k, schema="(Tensor(a!) y, Tensor x, float a, int n) -> ()", **kw)
    assert "int n" in str(op._opoverload._schema)


def test_schema_that_does_not_match_the_launcher():
    def launcher(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a

    with pytest.raises(CustomOpError, match=r"has arguments \(a, c\) but launcher.*takes \(a, b\)"):
        custom_op(qual("l"), launcher, schema="(Tensor a, Tensor c) -> Tensor", out_like="a")

    def untyped(a, b):
        return a

    with pytest.raises(CustomOpError, match=r"type hints of launcher.*untyped.*Parameter a"):
        custom_op(qual("l"), untyped, out_like="a")
    with pytest.raises(CustomOpError, match=r"mutates_args names 'z'.*parameters: a, b"):
        custom_op(qual("l"), launcher, mutates_args=("z",), out_like="a")


def test_missing_fake_for_out_of_place_op(prog):
    with pytest.raises(CustomOpError, match=r"returns outputs \['result'\].*fake.*out_like='a'"):
        custom_op(qual("m"), prog.kernel("muladd"), outputs=("result",), grid=1, block=256)

    def launcher(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a

    with pytest.raises(CustomOpError, match=r"returns 1 value.*needs a fake.*out_like='a'"):
        custom_op(qual("l"), launcher)


def test_other_mistakes(prog):
    k = prog.kernel("saxpy")
    with pytest.raises(CustomOpError, match=r"returns nothing and mutates nothing"):
        custom_op(qual("s"), k, grid=1, block=256)
    with pytest.raises(CustomOpError, match=r"needs grid= and block=.*lambda y, x, a, n"):
        custom_op(qual("s"), k, mutates_args=("y",))
    with pytest.raises(CustomOpError, match=r"mutates_args='unknown' is not accepted"):
        custom_op(qual("s"), k, mutates_args="unknown", grid=1, block=1)
    m = prog.kernel("muladd")
    with pytest.raises(CustomOpError, match=r"out_like names 'c', which is not a Tensor"):
        custom_op(qual("m"), m, outputs=("result",), out_like="c", grid=1, block=1)
    with pytest.raises(CustomOpError, match=r"out_like names 2 argument.*returns 1"):
        custom_op(qual("m"), m, outputs=("result",), out_like=("a", "b"), grid=1, block=1)
    with pytest.raises(CustomOpError, match=r"fake= or out_like=, not both"):
        custom_op(
            qual("m"), m, outputs=("result",), out_like="a", fake=lambda *a: None, grid=1, block=1
        )
    with pytest.raises(CustomOpError, match=r"expected a cuforge Kernel.*or a launcher"):
        custom_op(qual("x"), "saxpy", mutates_args=("y",))

    def launcher(y: torch.Tensor) -> None:
        pass

    with pytest.raises(CustomOpError, match=r"outputs= is for kernels"):
        custom_op(qual("l"), launcher, outputs=("y",))
    with pytest.raises(CustomOpError, match=r"grid= and block= are for kernels"):
        custom_op(qual("l"), launcher, mutates_args=("y",), grid=1, block=1)


def test_errors_are_value_errors_and_cuforge_errors():
    assert issubclass(CustomOpError, ValueError)
    assert issubclass(CustomOpError, cuforge.base.errors.CuforgeError)


def test_kernel_outputs_allocated_by_the_fake(prog):
    rec = RecordingKernel(prog.kernel("sin_cos"))
    op = custom_op(
        qual("sin_cos"),
        rec,
        outputs=("s", "c"),
        fake=lambda x, n: (torch.empty_like(x), torch.empty_like(x)),
        grid=1,
        block=64,
        device_types="cpu",
    )
    x = torch.zeros(10)
    s, c = op(x, 10)
    ((_, args),) = rec.launches
    assert args[1] is s and args[2] is c
    bad = custom_op(
        qual("sin_cos"),
        rec,
        outputs=("s", "c"),
        fake=lambda x, n: torch.empty_like(x),
        grid=1,
        block=64,
        device_types="cpu",
    )
    with pytest.raises(CustomOpError, match=r"fake allocates the outputs.*must return 2 tensors"):
        bad(x, 10)


def test_cuforge_jit_executor_is_a_kernel_and_the_template_is_refused():
    jit = pytest.importorskip("cuforge.frontend.jitkernel").jit
    k = jit(
        "template <typename T, int BLOCK>\n"
        "__global__ void scale(const T* x, T* out, T alpha, int n) {\n"
        "    int i = blockIdx.x * BLOCK + threadIdx.x;\n"
        "    if (i < n) out[i] = alpha * x[i];\n"
        "}\n",
        "scale",
        arch="sm_90",
    )
    exe = k.specialize(T="double", BLOCK=128)
    q = qual("scale")
    op = custom_op(q, exe, outputs=("out",), out_like="x", grid=1, block=128)
    assert str(op_of(q)._schema) == f"{q}(Tensor x, float alpha, SymInt n) -> Tensor"
    x = torch.empty(5, dtype=torch.float64, device="meta")
    assert op(x, 2.0, 5).dtype == torch.float64
    with pytest.raises(CustomOpError, match=r"cuforge.jit kernel.*k.compile.*k.specialize"):
        custom_op(qual("scale"), k, outputs=("out",), out_like="x", grid=1, block=128)


# -- the lean registration (docs/custom_ops.md, "Cost per call") ----------------------------


def test_registration_is_lean_and_still_a_custom_op_def(prog):
    from torch._library.custom_ops import CustomOpDef

    rec = RecordingKernel(prog.kernel("saxpy"))
    q = qual("saxpy")
    op = custom_op(q, rec, mutates_args=("y",), grid=1, block=32, device_types="cpu")
    assert isinstance(op, CustomOpDef)  # opcheck, register_* take it
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has(q, "CPU")
    # no per-call Python autograd / ADInplaceOrView kernels until autograd is asked for
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(q, "Autograd")
    assert not has(q, "ADInplaceOrView")
    y, x = torch.zeros(8), torch.ones(8)
    before = y._version
    assert op(y, x, 2.0, 8) is None
    assert y._version > before  # the write is visible to autograd's saved-tensor checks
    assert x._version == 0  # a read-only input is not bumped
    assert len(rec.launches) == 1
    with torch.inference_mode():  # inference tensors have no version counter: no error
        yi, xi = torch.zeros(8), torch.ones(8)
        op(yi, xi, 2.0, 8)
    assert len(rec.launches) == 2
    # the fake still runs under FakeTensorMode and in torch.compile tracing
    results = torch.library.opcheck(op, (torch.zeros(8), torch.ones(8), 2.0, 8))
    assert all(v == "SUCCESS" for v in results.values()), results


def test_register_autograd_and_fake_on_the_lean_op():
    q = qual("scale")
    calls = []

    @custom_op(q, out_like="x", device_types="cpu")
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        calls.append(alpha)
        return x * alpha

    x = torch.ones(4, requires_grad=True)
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(q, "Autograd")
    # no autograd formula yet: a call that autograd would need one for says so (no silent
    # backward); without grad it runs
    with pytest.raises(RuntimeError, match="'x' requires grad but the op has no autograd"):
        scale(x, 3.0)
    with torch.no_grad():
        assert scale(x, 3.0).tolist() == [3.0] * 4
    assert scale(x.detach(), 3.0).tolist() == [3.0] * 4

    def setup_context(ctx, inputs, output):
        ctx.alpha = inputs[1]

    scale.register_autograd(lambda ctx, g: (g * ctx.alpha, None), setup_context=setup_context)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(q, "Autograd")
    (grad,) = torch.autograd.grad(scale(x, 3.0).sum(), x)
    assert grad.tolist() == [3.0] * 4
    # register_fake replaces the fake: the next trace uses it
    seen = []

    @scale.register_fake
    def _(x, alpha):
        seen.append(alpha)
        return torch.empty_like(x)

    compiled = torch.compile(lambda t: scale(t, 2.0), fullgraph=True, backend="eager")
    assert compiled(torch.ones(4)).tolist() == [2.0] * 4
    assert seen and calls[-1] == 2.0


def test_mutated_argument_passed_by_keyword_is_bumped():
    q = qual("fill")

    @custom_op(q, mutates_args=("out",), device_types="cpu")
    def fill(x: torch.Tensor, out: torch.Tensor) -> None:
        out.numpy()[:] = x.numpy()  # a write torch does not see, as a kernel's

    x, out = torch.ones(3), torch.zeros(3)
    v = out._version
    op_of(q)(x, out=out)
    assert out.tolist() == [1.0] * 3 and out._version > v


def test_kernel_impl_is_generated_straight_line_and_keyword_only_schemas_still_work(prog):
    rec = RecordingKernel(prog.kernel("saxpy"))
    op = custom_op(qual("saxpy"), rec, mutates_args=("y",), grid=1, block=32, device_types="cpu")
    assert "def impl(y, x, a, n):" in op._init_fn._cuforge_source
    rec2 = RecordingKernel(prog.kernel("saxpy"))
    kw = custom_op(
        qual("saxpy"),
        rec2,
        schema="(Tensor(a!) y, Tensor x, *, float a, SymInt n) -> ()",
        mutates_args=("y",),
        grid=lambda y, x, a, n: (n + 31) // 32,
        block=32,
        device_types="cpu",
    )
    assert not hasattr(kw._init_fn, "_cuforge_source")  # the general impl takes keywords
    y, x = torch.zeros(40), torch.ones(40)
    kw(y, x, a=2.0, n=40)
    ((config, args),) = rec2.launches
    assert config == (2, 32, 0) and args[0] is y and args[1] is x and args[2:] == (2.0, 40)


def test_a_cpu_kernel_beside_the_cuda_one_gets_what_torch_would_do_around_it():
    """Found by running pytorch/extension-cpp's own suite against a cuforge port of it: a
    CPU kernel added with ``register_kernel`` to a mutating op (extension-cpp's
    ``myadd_out``) that calls a torch op with ``out=``, given inputs that require grad. With
    torch's ``custom_op`` that works (its autograd kernel runs the device kernel below
    autograd) and the written tensor's version is bumped (its ADInplaceOrView kernel);
    cuforge's lean op registers neither layer, so its device kernels do both themselves."""
    q = qual("myadd_out")

    @custom_op(q, mutates_args=("out",))
    def myadd_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        raise AssertionError("the CUDA kernel: not called on CPU tensors")

    @myadd_out.register_kernel("cpu")
    def cpu(a, b, out):
        torch.add(a, b, out=out)  # refuses inputs that require grad, above autograd

    assert cpu is not None  # the decorator returns the function it was given
    a, b = torch.randn(20, requires_grad=True), torch.randn(20)
    out = torch.randn(20, requires_grad=True)
    before = out._version
    myadd_out(a, b, out)
    torch.testing.assert_close(out.detach(), (a + b).detach())
    assert out._version > before and out.grad_fn is None  # no graph recorded
    for args in ((a, b, out), (a.detach(), b, out.detach())):
        results = torch.library.opcheck(op_of(q), args)
        assert set(results.values()) == {"SUCCESS"}, results

    # an op that returns tensors and has no autograd formula still refuses a grad input
    r = qual("mymul")

    @custom_op(r, fake=lambda a, b: torch.empty_like(a))
    def mymul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the CUDA kernel: not called on CPU tensors")

    mymul.register_kernel("cpu")(lambda a, b: a * b)
    torch.testing.assert_close(mymul(a.detach(), b), a.detach() * b)
    with pytest.raises(RuntimeError, match="argument 'a' requires grad"):
        mymul(a, b)


def test_each_written_tensor_is_bumped_once_positional_or_keyword():
    """The device kernel bumps the version of every tensor the schema marks written, once,
    whether it came positionally or by keyword (one written tensor and several take
    different code)."""

    def fill2(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> None:
        a.data.copy_(x)  # .data: writes that bump nothing themselves
        b.data.copy_(x)

    def fill1(a: torch.Tensor, x: torch.Tensor) -> None:
        a.data.copy_(x)

    two = custom_op(qual("fill2"), fill2, mutates_args=("a", "b"), device_types="cpu", cpp=False)
    one = custom_op(qual("fill1"), fill1, mutates_args=("a",), device_types="cpu", cpp=False)
    a, b, x = torch.zeros(2), torch.zeros(2), torch.ones(2)
    two(a, b, x)
    assert (a._version, b._version, x._version) == (1, 1, 0) and a.tolist() == [1.0, 1.0]
    two(a, b=b, x=x)
    assert (a._version, b._version, x._version) == (2, 2, 0)
    one(a, x)
    one(a=a, x=x)
    assert (a._version, b._version, x._version) == (4, 2, 0)
