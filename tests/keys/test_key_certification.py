"""Certified keys, kernels first (issue 24, item 3): a key must be *stable* (the same
inputs give the same key whatever else differs) and *sufficient* (every input that changes
the generated code changes the key).

* **Sufficient**: :data:`KERNEL_MUTATIONS` is the one table of kernel inputs. Each row
  names the key field it proves (``covers``) and a mutation of a base compile; the test
  compiles both (real NVRTC, through ``compile_cached``) and asserts the keys differ.
  :func:`test_every_kernel_key_field_has_a_mutation` fails when a key field appears in
  ``key_fields`` that no row covers, and when an allow-listed codegen variable has no row:
  adding a key field without a mutation test fails.
* **Stable**: the same compiles in fresh processes under each perturbation of
  :data:`PERTURBATIONS` (hash seed, HOME / XDG dirs, venv prefix, checkout path and cwd,
  build order, host name and pid, cache dir) give the same keys as a baseline process.

The same design covers the other kinds, one table each: the Python fingerprint rules
(:data:`FINGERPRINT_RULES`), cute, cccl, cuda.core's header digest, JAX and CuPy (their
entry keys are pure functions of the framework's own key; no JAX or CuPy needed),
Triton (:data:`TRITON_MUTATIONS`: Triton's key as ``triton.compile`` computes it under
cuforge's manager, no compile) and torch extensions (tests/torch/test_key_certification_torch.py, run by
``make test-integrations``: it imports torch in every fresh process). :func:`check_stable`
runs any kind's keys under every perturbation.

The kernel rows need NVRTC (the cuda-toolkit wheels of the test extra): they skip without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import cuforge
from cuforge.base.config import CODEGEN_ENV_VARS
from tests.child import SRC

HEADER = "#define V 1\n"
INLINE = "#define W 2\n"
#: the base kernel: a header reached through the include path, an inline header and a
#: template instance (so every kind of key field is present)
BASE_SOURCE = """#include "v.h"
#include "inline.h"
template <int N> __global__ void t(float* x) { x[0] = N + V + W; }
extern "C" __global__ void k(float* x) { x[0] = V; }
"""


@dataclass
class Call:
    """One compile: ``compile_cached`` keywords plus the files and environment around it."""

    source: str = BASE_SOURCE
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: files under the project dir (path -> content)
    files: dict[str, str] = field(default_factory=lambda: {"inc/v.h": HEADER})
    env: dict[str, str] = field(default_factory=dict)
    version: str | None = None

    def replace(self, **changes: Any) -> Call:
        out = Call(self.source, dict(self.kwargs), dict(self.files), dict(self.env), self.version)
        for name, value in changes.items():
            setattr(out, name, value)
        return out

    def with_kwargs(self, **kw: Any) -> Call:
        return self.replace(kwargs={**self.kwargs, **kw})

    def with_env(self, **env: str) -> Call:
        return self.replace(env={**self.env, **env})

    def with_file(self, path: str, content: str) -> Call:
        return self.replace(files={**self.files, path: content})


BASE_KWARGS: dict[str, Any] = {
    "name": "k.cu",
    "include_dirs": ["inc"],
    "headers": {"inline.h": INLINE},
    "name_expressions": ["t<1>"],
    "arch": "sm_90",
}


def _base() -> Call:
    return Call(kwargs=dict(BASE_KWARGS))


def _no_inline() -> Call:
    """The base kernel without in-memory headers (nvcc takes none)."""
    kw = {k: v for k, v in BASE_KWARGS.items() if k != "headers"}
    return Call(source=BASE_SOURCE.replace('#include "inline.h"', "#define W 2"), kwargs=kw)


def _spelling(include: str, files: dict[str, str], **kw: Any) -> Call:
    """The base kernel reaching v.h through the include line ``include``."""
    return _base().replace(source=BASE_SOURCE.replace('#include "v.h"', include), files=files)


def _toolkit_root() -> str:
    from cuforge import toolchain

    return str(toolchain.toolkit_root() or "")


#: each allow-listed codegen variable, and a value that must change the key (set where the
#: base leaves it unset); one row per variable is generated below
ENV_VALUES: dict[str, Callable[[], str]] = {
    "NVCC_PREPEND_FLAGS": lambda: "-lineinfo",
    "NVCC_APPEND_FLAGS": lambda: "-lineinfo",
    "CUDA_HOME": _toolkit_root,
    "CUDA_PATH": _toolkit_root,
    "CUFORGE_EXTRA_OPTIONS": lambda: "-lineinfo",
    "CUFORGE_NVCC": lambda: shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc",
}


@dataclass
class Mutation:
    #: the key field (a label of ``key_fields``) this row proves
    covers: str
    what: str
    #: (base, mutated) calls; their keys must differ
    make: Callable[[], tuple[Call, Call]]
    #: why the key cannot be proven here by a real mutation (the row then checks that the
    #: field records what would differ), or None
    not_here: str | None = None


def _m(covers: str, what: str, mutate: Callable[[Call], Call], base=_base) -> Mutation:
    return Mutation(covers, what, lambda: (base(), mutate(base())))


_NESTED = {"inc/v.h": HEADER, "inc/sub/.keep": ""}
KERNEL_MUTATIONS: list[Mutation] = [
    _m("name", "the file name", lambda c: c.with_kwargs(name="other.cu")),
    _m("source", "one source byte", lambda c: c.replace(source=c.source.replace("N + V", "N - V"))),
    _m("backend", "nvrtc -> nvcc", lambda c: c.with_kwargs(backend="nvcc"), base=_no_inline),
    _m("output", "cubin -> ptx", lambda c: c.with_kwargs(output="ptx")),
    _m("arch", "sm_90 -> sm_90a", lambda c: c.with_kwargs(arch="sm_90a")),
    _m("arch", "sm_90 -> sm_80", lambda c: c.with_kwargs(arch="sm_80")),
    _m("options", "-lineinfo", lambda c: c.with_kwargs(options=["-lineinfo"])),
    _m("options", "--use_fast_math", lambda c: c.with_kwargs(options=["--use_fast_math"])),
    _m("options", "-std=c++20", lambda c: c.with_kwargs(options=["-std=c++20"])),
    _m("options", "a define", lambda c: c.with_kwargs(defines={"EXTRA": 1})),
    _m("options", "a define's value", lambda c: c.with_kwargs(defines={"V2": 2})),
    _m("options", "another include dir", lambda c: c.with_kwargs(include_dirs=["inc", "inc2"]).with_file("inc2/.keep", "")),
    _m("name_expressions", "another template instance", lambda c: c.with_kwargs(name_expressions=["t<2>"])),
    _m("inline_headers", "an inline header's byte", lambda c: c.with_kwargs(headers={"inline.h": "#define W 3\n"})),
    _m("headers", "a header byte, same size (#include \"v.h\" via -I)", lambda c: c.with_file("inc/v.h", "#define V 2\n")),
    Mutation("headers", "a header byte via #include <v.h>", lambda: (
        _spelling("#include <v.h>", {"inc/v.h": HEADER}),
        _spelling("#include <v.h>", {"inc/v.h": "#define V 3\n"}),
    )),
    Mutation("headers", "a header byte via a path relative to the source dir", lambda: (
        _spelling('#include "inc/v.h"', {"inc/v.h": HEADER}),
        _spelling('#include "inc/v.h"', {"inc/v.h": "#define V 4\n"}),
    )),
    Mutation("headers", "a header byte via sub/../v.h", lambda: (
        _spelling('#include "sub/../v.h"', _NESTED),
        _spelling('#include "sub/../v.h"', {**_NESTED, "inc/v.h": "#define V 5\n"}),
    )),
    _m("cuforge", "the cuforge version", lambda c: c.replace(version="999.0.0")),
    Mutation("compiler", "the compiler identity", lambda: (_base(), _base()),
             not_here="one NVRTC per venv (tests/test_cuda12.py runs NVRTC 12): the field "
             "must record the version and the library's SHA-256"),
    *[
        Mutation("env", f"{var} set", (lambda v: lambda: (_base(), _base().with_env(**{v: ENV_VALUES[v]()})))(var))
        for var in ENV_VALUES
    ],
]  # fmt: skip


# ---------------------------------------------------------------- running a call


def _nvrtc_or_skip() -> None:
    try:
        from cuforge import toolchain

        if toolchain.nvrtc_version() is None:
            raise RuntimeError("no NVRTC found")
    except Exception as exc:  # noqa: BLE001 - any failure means no NVRTC here
        pytest.skip(f"NVRTC is not usable here ({type(exc).__name__}: {exc})")


def _materialize(call: Call, root: str) -> str:
    os.makedirs(root, exist_ok=True)
    for path, content in call.files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(content)
    return root


def _key(call: Call, root: str, cache_dir: str, monkeypatch) -> tuple[str, dict]:
    from cuforge.core.pipeline import compile_cached

    _materialize(call, root)
    with monkeypatch.context() as m:
        for name, value in call.env.items():
            m.setenv(name, value)
        if call.version is not None:
            m.setattr("cuforge.keys.key.__version__", call.version)
        m.chdir(root)  # the base dir of keyed paths (CUFORGE_BASE_DIR unset)
        kw = dict(call.kwargs)
        kw["include_dirs"] = [os.path.join(root, d) for d in kw.get("include_dirs", [])]
        art = compile_cached(
            call.source, source_dir=root, cache=cuforge.Cache(cache_dir, memory=False), **kw
        )
    return art.key, art.key_fields


@pytest.mark.parametrize(
    "row", KERNEL_MUTATIONS, ids=[f"{m.covers}:{m.what}" for m in KERNEL_MUTATIONS]
)
def test_kernel_key_is_sufficient(row, tmp_path, monkeypatch, isolated_cache):
    _nvrtc_or_skip()
    base, mutated = row.make()
    if mutated.kwargs.get("backend") == "nvcc" and not shutil.which("nvcc"):
        nvcc = os.path.join(_toolkit_root(), "bin", "nvcc")
        if not os.path.exists(nvcc):
            pytest.skip("nvcc is not installed")
    key0, fields0 = _key(base, str(tmp_path / "p0"), str(tmp_path / "c0"), monkeypatch)
    assert row.covers in fields0, f"{row.covers!r} is not a key field: {sorted(fields0)}"
    if row.not_here is not None:
        record = json.dumps(fields0[row.covers])
        assert "version" in record and "sha256" in record, row.not_here
        return
    key1, fields1 = _key(mutated, str(tmp_path / "p1"), str(tmp_path / "c1"), monkeypatch)
    assert key0 != key1, f"{row.what} did not change the key"
    assert fields0[row.covers] != fields1.get(row.covers), (
        f"{row.what} changed the key but not the field {row.covers!r} it should"
    )


def test_every_kernel_key_field_has_a_mutation(tmp_path, monkeypatch, isolated_cache):
    """Adding a key field (or a codegen variable) without a row in KERNEL_MUTATIONS fails."""
    _nvrtc_or_skip()
    _, fields = _key(_base(), str(tmp_path / "p"), str(tmp_path / "c"), monkeypatch)
    covered = {m.covers for m in KERNEL_MUTATIONS}
    assert set(fields) <= covered, f"key fields with no mutation row: {set(fields) - covered}"
    env_rows = {m.what.split()[0] for m in KERNEL_MUTATIONS if m.covers == "env"}
    assert set(CODEGEN_ENV_VARS) <= env_rows, set(CODEGEN_ENV_VARS) - env_rows
    assert set(fields["env"]) == set(CODEGEN_ENV_VARS)


# ---------------------------------------------------------------- stable

_CHILD = """
import json, os, sys
import cuforge
from cuforge.core.pipeline import compile_cached
root, order = sys.argv[1], sys.argv[2]
calls = {
    "a": dict(name="a.cu", source='#include "v.h"\\nextern "C" __global__ void a(float*x){x[0]=V;}'),
    "b": dict(name="b.cu", source='extern "C" __global__ void b(float*x){x[0]=2;}'),
}
keys = {}
for label in order:
    c = calls[label]
    art = compile_cached(c["source"], name=c["name"], include_dirs=[os.path.join(root, "inc")],
                         source_dir=root, arch="sm_90")
    keys[label] = art.key
print(json.dumps(keys))
"""

#: name -> how a perturbed child differs from the baseline (see _run_child)
PERTURBATIONS = (
    "PYTHONHASHSEED",
    "HOME and XDG dirs",
    "venv prefix",
    "checkout path and cwd",
    "build order",
    "host name and pid",
    "cache dir",
)


def _run_child(tmp_path, tag: str, *, root=None, order="ab", env=None, python=None, host=None):
    root = root or str(tmp_path / "checkout")
    _materialize(Call(files={"inc/v.h": HEADER}), root)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    environ.update(
        PYTHONPATH=SRC,
        PYTHONHASHSEED="0",
        CUFORGE_CACHE_DIR=str(tmp_path / "cache-base"),
        CUFORGE_ARCH="sm_90",
    )
    environ.update(env or {})
    cmd = [python or sys.executable, str(script), root, order]
    if host is not None:
        cmd = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *cmd]
    done = subprocess.run(cmd, cwd=root, env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{tag}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernel_key_is_stable(tmp_path):
    _nvrtc_or_skip()
    base = _run_child(tmp_path, "baseline")
    homes = {
        "HOME": str(tmp_path / "home2"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg-cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"),
        "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
    }
    alias = tmp_path / "venv-alias"
    alias.symlink_to(sys.prefix)  # the same venv reached through another prefix path
    python = str(alias / "bin" / os.path.basename(sys.executable))
    hostname_ok = os.geteuid() == 0 and shutil.which("unshare") is not None
    runs = {
        "PYTHONHASHSEED": dict(env={"PYTHONHASHSEED": "12345"}),
        "HOME and XDG dirs": dict(env=homes),
        "venv prefix": dict(python=python),
        "checkout path and cwd": dict(root=str(tmp_path / "elsewhere" / "clone")),
        "build order": dict(order="ba"),
        "host name and pid": dict(host="other-host") if hostname_ok else dict(),
        "cache dir": dict(env={"CUFORGE_CACHE_DIR": str(tmp_path / "cache-other")}),
    }
    assert set(runs) == set(PERTURBATIONS)
    differ = {
        name: got for name, kw in runs.items() if (got := _run_child(tmp_path, name, **kw)) != base
    }
    assert not differ, f"keys changed under {sorted(differ)}: {differ} vs {base}"


# ---------------------------------------------------------------- Python fingerprint rules

#: the module a fingerprinted function reads an attribute of (``cfg.TILE``); created by
#: :func:`_cfg_module` (a real module, so the rule for module attributes applies)
_CFG_SOURCE = "TILE = 128\n"


def _cfg_module(tile: int) -> Any:
    """A fresh module object loaded from one source file (so its source fingerprint is the
    same every time), its ``TILE`` then set to ``tile`` as code does at run time."""
    import atexit
    import importlib.util
    import tempfile

    global _cfg_path
    if _cfg_path is None:
        directory = tempfile.mkdtemp(prefix="cuforge-cert-")
        atexit.register(shutil.rmtree, directory, True)
        _cfg_path = os.path.join(directory, "cuforge_cert_cfg.py")
        with open(_cfg_path, "w") as f:
            f.write(_CFG_SOURCE)
    spec = importlib.util.spec_from_file_location("cuforge_cert_cfg", _cfg_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.TILE = tile
    return module


_cfg_path: str | None = None


def _fn(source: str, **glb: Any) -> Any:
    """The function ``f`` that ``source`` defines, in a globals dict holding ``glb``."""
    namespace: dict[str, Any] = {"__name__": "cert_local", **glb}
    exec(source, namespace)  # noqa: S102 - test code, fixed text
    return namespace["f"]


def _closure(value: Any) -> Any:
    def outer():
        def f(x):
            return x * value

        return f

    return outer()


def _with_attr(tile: int) -> Any:
    f = _fn("def f(x):\n    return x\n")
    f.tile = tile
    return f


def _klass(tile: int) -> type:
    return type("Tiling", (), {"tile": tile, "__module__": "cert_local"})


@dataclass
class Rule:
    #: what of a function this row proves: an attribute ``fn.__X__`` that the hasher's
    #: function rule reads, or the label of a rule it applies to what those hold
    covers: str
    what: str
    #: (base, mutated) objects; their fingerprints must differ
    make: Callable[[], tuple[Any, Any]]


FINGERPRINT_RULES: list[Rule] = [
    Rule("__qualname__", "another function name", lambda: (
        _fn("def f(x):\n    return x\n"), _fn("def g(x):\n    return x\nf = g\n"))),
    Rule("__code__", "a constant", lambda: (
        _fn("def f(x):\n    return x + 1\n"), _fn("def f(x):\n    return x + 2\n"))),
    Rule("__code__", "an operator", lambda: (
        _fn("def f(x):\n    return x + 1\n"), _fn("def f(x):\n    return x - 1\n"))),
    Rule("__code__", "a nested function's constant", lambda: (
        _fn("def f(x):\n    def g():\n        return 1\n    return g\n"),
        _fn("def f(x):\n    def g():\n        return 2\n    return g\n"))),
    Rule("__globals__", "a global's value", lambda: (
        _fn("def f(x):\n    return x + G\n", G=1), _fn("def f(x):\n    return x + G\n", G=2))),
    Rule("__globals__", "a global function's body", lambda: (
        _fn("def f(x):\n    return h(x)\n", h=_fn("def f(x):\n    return x\n")),
        _fn("def f(x):\n    return h(x)\n", h=_fn("def f(x):\n    return -x\n")))),
    Rule("class attribute", "a global class's attribute", lambda: (
        _fn("def f(x):\n    return x * C.tile\n", C=_klass(1)),
        _fn("def f(x):\n    return x * C.tile\n", C=_klass(2)))),
    Rule("module attribute", "a module attribute the code reads (cfg.TILE)", lambda: (
        _fn("def f(x):\n    return x * cfg.TILE\n", cfg=_cfg_module(128)),
        _fn("def f(x):\n    return x * cfg.TILE\n", cfg=_cfg_module(256)))),
    Rule("builtin", "a builtin the code calls", lambda: (
        _fn("def f(x):\n    return abs(x)\n", __builtins__={"abs": abs}),
        _fn("def f(x):\n    return abs(x)\n", __builtins__={"abs": min}))),
    Rule("__closure__", "a closure cell's value", lambda: (_closure(1), _closure(2))),
    Rule("__defaults__", "a default", lambda: (
        _fn("def f(x, s=1):\n    return x * s\n"), _fn("def f(x, s=2):\n    return x * s\n"))),
    Rule("__kwdefaults__", "a keyword-only default", lambda: (
        _fn("def f(x, *, s=1):\n    return x * s\n"), _fn("def f(x, *, s=2):\n    return x * s\n"))),
    Rule("__dict__", "a function attribute", lambda: (_with_attr(1), _with_attr(2))),
    Rule("__annotations__", "an annotation", lambda: (
        _fn("def f(x: int):\n    return x\n"), _fn("def f(x: float):\n    return x\n"))),
]  # fmt: skip

#: rules applied to what a function reads, that the source scan below cannot see: the
#: row's ``covers`` -> the hasher method that implements it
_INDIRECT_RULES = {
    "class attribute": "_class",
    "module attribute": "_module_values",
    "builtin": "_function",
}


@pytest.mark.parametrize(
    "row", FINGERPRINT_RULES, ids=[f"{r.covers}:{r.what}" for r in FINGERPRINT_RULES]
)
def test_fingerprint_rule_is_sufficient(row):
    from cuforge.keys.fingerprint import fingerprint

    base, mutated = row.make()
    assert fingerprint(base, what="f") == fingerprint(row.make()[0], what="f"), "not stable"
    assert fingerprint(base, what="f") != fingerprint(mutated, what="f"), (
        f"{row.what} did not change the fingerprint"
    )


def test_every_function_attribute_the_fingerprint_reads_has_a_rule():
    """Reading another ``fn.__X__`` in the function rule without a row here fails."""
    import inspect
    import re

    from cuforge.keys import fingerprint as fp

    read = set(re.findall(r"\bfn\.(__\w+__)", inspect.getsource(fp._Hasher._function)))
    covered = {r.covers for r in FINGERPRINT_RULES}
    assert read <= covered, f"function attributes keyed with no mutation row: {read - covered}"
    for covers, method in _INDIRECT_RULES.items():
        assert covers in covered and hasattr(fp._Hasher, method), covers


_FP_MODULE = """
import cuforge_cert_cfg as cfg

G = 3


class Tiling:
    tile = 4


def helper(x):
    return x + G


def make(scale):
    def inner(x, s=2, *, t=5):
        return helper(x) * scale * s * t * Tiling.tile * cfg.TILE
    inner.unroll = 2
    return inner


def plain(x: int) -> int:
    return abs(x) + cfg.TILE
"""

_FP_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import cuforge_cert_mod as m
from cuforge.keys.fingerprint import fingerprint, module_fingerprint
print(json.dumps({
    "make": fingerprint(m.make(3), what="make"),
    "plain": fingerprint(m.plain, what="plain"),
    "class": fingerprint(m.Tiling, what="Tiling"),
    "module": module_fingerprint(m).split(" ", 1)[1],
}))
"""


def _fp_child(tmp_path, where: str, *, cwd=None, seed="0") -> dict:
    root = tmp_path / where
    root.mkdir(parents=True, exist_ok=True)
    (root / "cuforge_cert_mod.py").write_text(_FP_MODULE)
    (root / "cuforge_cert_cfg.py").write_text(_CFG_SOURCE)
    script = tmp_path / "fp_child.py"
    script.write_text(_FP_CHILD)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    environ.update(PYTHONPATH=SRC, PYTHONHASHSEED=seed, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, str(script), str(root)],
        cwd=str(cwd or root), env=environ, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, f"{where}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fingerprints_are_stable(tmp_path):
    """A local module's functions, class and the module itself fingerprint the same under
    another hash seed, another cwd, and a copy of the module at another path (local modules
    are keyed by their source, never its path)."""
    base = _fp_child(tmp_path, "a")
    runs = {
        "PYTHONHASHSEED": dict(where="a", seed="4242"),
        "cwd": dict(where="a", cwd=tmp_path),
        "a copy at another path": dict(where="elsewhere/deeper/b"),
    }
    differ = {name: got for name, kw in runs.items() if (got := _fp_child(tmp_path, **kw)) != base}
    assert not differ, f"fingerprints changed under {sorted(differ)}: {differ} vs {base}"


# ---------------------------------------------------------------- blob kinds: cute


@dataclass
class BlobMutation:
    """One input of a blob kind's key: ``fields(monkeypatch)`` returns the labeled key
    fields of (base, mutated); the field ``covers`` must differ. ``env``: the mutation is
    an environment variable the integration reads once per process: the mutated fields
    come from a fresh process with it set (``fields`` then gives the base alone)."""

    covers: str
    what: str
    fields: Callable[[Any], tuple[dict, dict | None]]
    env: dict[str, str] | None = None
    #: why no real mutation is possible here (the row checks the recorded value), or None
    not_here: str | None = None
    #: for kinds keyed in a child process (cccl): the expression the child evaluates
    code: str = ""


def _cute_or_skip() -> Any:
    from tests.conftest import GPU_VISIBLE

    if not GPU_VISIBLE:
        # the DSL reads its settings once, at its first import (as tests/cute does)
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    pytest.importorskip("cutlass.cute", reason="the CuTe DSL is not installed")
    from cuforge.cute import cache as cute_cache

    return cute_cache


def _cute_key(*args: Any, **kw: Any) -> dict:
    from cuforge.cute import cache as cute_cache

    return cute_cache.key_fields(*args, **kw)


def _cute_base() -> dict:
    from tests.cute import kernels as K

    return _cute_key(K.scale, *K.fake_args())


def _cute_pair(mutate: Callable[[Any, Any], dict]) -> Callable[[Any], tuple[dict, dict]]:
    """(base, ``mutate(K, monkeypatch)``) where K is tests.cute.kernels."""

    def pair(monkeypatch):
        from tests.cute import kernels as K

        base = _cute_base()
        return base, mutate(K, monkeypatch)

    return pair


def _cute_dtype(K, mp):
    import cutlass
    from cutlass.cute.runtime import make_fake_compact_tensor

    n = K.fake_args()[0].shape[0]
    return _cute_key(K.scale, *(make_fake_compact_tensor(cutlass.Float16, (n,)) for _ in "ab"))


def _cute_global(K, mp):
    mp.setattr(K, "SCALE", K.SCALE + 1.0)  # a global the kernel body reads
    return _cute_base()


def _cute_dsl_version(K, mp):
    from cuforge.cute import version

    real = version.dsl_distributions()
    mp.setattr(version, "dsl_distributions", lambda: [d.replace("==", "==999.") for d in real])
    version.reset()
    try:
        return _cute_base()
    finally:
        mp.undo()
        version.reset()


def _cute_format(K, mp):
    from cuforge.cute import cache as cute_cache

    mp.setattr(cute_cache, "FORMAT", f"{cute_cache.FORMAT}-next")
    return _cute_base()


def _cute_hooks(monkeypatch):
    from tests.cute import kernels as K

    def h1(module):
        return module

    def h2(module):
        return None

    a, b = K.fake_args()
    return (
        _cute_key(K.scale, a, b, trace_finalize_hooks=[h1]),
        _cute_key(K.scale, a, b, trace_finalize_hooks=[h2]),
    )


def _cute_streams(monkeypatch):
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    from tests.cute import kernels as K

    @cute.jit
    def s1(a: cute.Tensor, stream: cuda.CUstream = cuda.CUstream(1)):  # noqa: B008
        pass

    @cute.jit
    def s2(a: cute.Tensor, stream: cuda.CUstream = cuda.CUstream(2)):  # noqa: B008
        pass

    a, _ = K.fake_args()
    return _cute_key(s1, a), _cute_key(s2, a)


def _cute_constexpr(monkeypatch):
    from tests.cute import kernels as K

    a, b = K.fake_args()
    return _cute_key(K.scale_times, a, b, 2), _cute_key(K.scale_times, a, b, 3)


def _cute_callable(monkeypatch):
    from tests.cute import classes as C
    from tests.cute import kernels as K

    a, b = K.fake_args()
    return _cute_key(C.ScaleKernel().run, a, b), _cute_key(C.ScaleKernel(), a, b)


CUTE_MUTATIONS: list[BlobMutation] = [
    BlobMutation("format", "the entry format", _cute_pair(_cute_format)),
    BlobMutation("python", "the Python version", lambda mp: (_cute_base(), None),
                 not_here="one Python per venv: the field records major.minor"),
    BlobMutation("function", "another @cute.jit function", _cute_pair(
        lambda K, mp: _cute_key(K.scale_times, *K.fake_args()))),
    BlobMutation("dsl", "the DSL version", _cute_pair(_cute_dsl_version)),
    BlobMutation("arch", "CUTE_DSL_ARCH sm_90a -> sm_100a", lambda mp: (_cute_base(), None),
                 env={"CUTE_DSL_ARCH": "sm_100a"}),
    BlobMutation("dsl_settings", "CUTE_DSL_LINEINFO=1", lambda mp: (_cute_base(), None),
                 env={"CUTE_DSL_LINEINFO": "1"}),
    BlobMutation("options", "--opt-level 2", _cute_pair(
        lambda K, mp: _cute_key(K.scale, *K.fake_args(), options="--opt-level 2"))),
    BlobMutation("callable", "bound method -> instance.__call__", _cute_callable),
    BlobMutation("fingerprint", "a global the kernel reads", _cute_pair(_cute_global)),
    BlobMutation("trace_finalize_hooks", "another trace hook", _cute_hooks),
    BlobMutation("args", "the tensors' dtype", _cute_pair(_cute_dtype)),
    BlobMutation("args", "a static extent", _cute_pair(
        lambda K, mp: _cute_key(K.scale, *K.fake_args(256)))),
    BlobMutation("args", "a Constexpr argument", _cute_constexpr),
    BlobMutation("handle_defaults", "a stream default CUstream(1) -> CUstream(2)", _cute_streams),
]  # fmt: skip

_CUTE_CHILD = """
import json
from tests.cute import kernels as K
from cuforge.cute import cache
print(json.dumps(cache.key_fields(K.scale, *K.fake_args())))
"""


def _cute_child(env: dict[str, str]) -> dict:
    from tests.child import run_python
    from tests.conftest import ROOT

    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join([SRC, ROOT])
    environ.setdefault("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    environ.update(env)
    return run_python(_CUTE_CHILD, environ, cwd=ROOT, stderr_key="stderr")


def _check_blob_row(row: BlobMutation, monkeypatch, child: Callable[[dict], dict]) -> None:
    base, mutated = row.fields(monkeypatch)
    assert row.covers in base or (mutated and row.covers in mutated), (
        f"{row.covers!r} is not a key field: {sorted(base)}"
    )
    if row.not_here is not None:
        assert base[row.covers], row.not_here
        return
    if row.env is not None:
        # both sides in a child, from the same environment but the variable: the base is
        # then independent of what earlier tests left in this process (a DSL arch, a memo)
        base = child({})
        base.pop("stderr", None)
        mutated = child(row.env)
        mutated.pop("stderr", None)
    assert base != mutated, f"{row.what} did not change the key"
    assert base.get(row.covers) != mutated.get(row.covers), (
        f"{row.what} changed the key but not the field {row.covers!r} it should"
    )


@pytest.mark.parametrize(
    "row", CUTE_MUTATIONS, ids=[f"{m.covers}:{m.what}" for m in CUTE_MUTATIONS]
)
def test_cute_key_is_sufficient(row, monkeypatch):
    _cute_or_skip()
    _check_blob_row(row, monkeypatch, _cute_child)


def _labels_in_source(fn: Callable) -> set[str]:
    """The field labels ``fn``'s source writes: ``fields["x"] = ...`` and the literal
    ``fields = {"x": ...}``."""
    import inspect
    import re

    src = inspect.getsource(fn)
    labels = set(re.findall(r'fields\["(\w+)"\]', src))
    literal = re.search(r"fields = \{(.*?)\n    \}", src, re.S)
    if literal:
        labels |= set(re.findall(r'^\s*"(\w+)":', literal.group(1), re.M))
    return labels


def test_every_cute_key_field_has_a_mutation(monkeypatch):
    """A field the cute key emits (in the source, or in any row's keys) with no row fails."""
    cute_cache = _cute_or_skip()
    covered = {m.covers for m in CUTE_MUTATIONS}
    emitted = _labels_in_source(cute_cache._key_fields)
    assert {"arch", "dsl", "options", "args"} <= emitted, emitted  # the scan still works
    for row in CUTE_MUTATIONS:
        base, mutated = row.fields(monkeypatch)
        monkeypatch.undo()
        emitted |= set(base) | set(mutated or ())
    assert emitted <= covered, f"cute key fields with no mutation row: {emitted - covered}"


# ---------------------------------------------------------------- blob kinds: cccl

#: the child's prelude: ``base()`` -> the kwargs of the base call of make_reduce_into,
#: ``fields(**kw)`` -> its labeled key fields (cuda.compute imported, no device: the
#: compute capability is explicit)
_CCCL_PRELUDE = """
import inspect, json, sys
import numpy as np
import cuda.compute as cc
from cuforge.cccl import _key
from cuforge.cccl._wrap import _original

ALGO = "make_reduce_into"
SIG = inspect.signature(_original(ALGO))

def base(**over):
    kw = dict(d_in=cc.ProxyArray(np.int32), d_out=cc.ProxyArray(np.int32), op=cc.OpKind.PLUS,
              h_init=np.zeros(1, np.int32), compute_capability=90)
    kw.update(over)
    return kw

def fields(algo=ALGO, **over):
    return _key.key_fields(algo, SIG, (), base(**over))

def versions(dist, value):
    real = _key._installed_versions()
    _key._versions_fields = None
    _key._installed_versions = lambda: {**real, _key._normalize(dist): value}
    try:
        return fields()
    finally:
        _key._installed_versions = lambda: real
        _key._versions_fields = None

G = 1
def add(a, b):
    return a + b
def sub(a, b):
    return a - b
def add_g(a, b):
    return a + b + G
"""


def _cccl_row(covers: str, what: str, code: str) -> BlobMutation:
    """A row whose mutated fields are ``code`` (an expression of the child's prelude)."""
    return BlobMutation(covers, what, lambda mp: ({}, None), code=code)


def _cccl_distributions() -> tuple[str, ...]:
    from cuforge.cccl._key import CODEGEN_DISTRIBUTIONS

    return CODEGEN_DISTRIBUTIONS


CCCL_MUTATIONS: list[BlobMutation] = [
    _cccl_row("algorithm", "another algorithm", 'fields(algo="make_reduce_into_v2")'),
    _cccl_row("python", "the Python version", "None"),
    _cccl_row("compute_capability", "9.0 -> 8.0", "fields(compute_capability=80)"),
    _cccl_row("compute_capability", "9.0 -> 9.0 and 10.0", "fields(compute_capability=[90, 100])"),
    _cccl_row("arg:d_in", "the input dtype", "fields(d_in=cc.ProxyArray(np.int64))"),
    _cccl_row("arg:d_out", "the output dtype", "fields(d_out=cc.ProxyArray(np.int64))"),
    _cccl_row("arg:op", "another well-known op", "fields(op=cc.OpKind.MAXIMUM)"),
    _cccl_row("arg:op", "a Python op's body", "[fields(op=add), fields(op=sub)]"),
    _cccl_row("arg:op", "a global a Python op reads", "[fields(op=add_g), (globals().update(G=2), fields(op=add_g))[1]]"),
    _cccl_row("arg:h_init", "the initial value's dtype", "fields(h_init=np.zeros(1, np.int64))"),
    *[
        _cccl_row(f"version:{dist}", f"{dist} upgraded", f"versions({dist!r}, '999.0')")
        for dist in ("cuda-cccl", "numba-cuda-mlir", "numba-cuda", "numba", "llvmlite",
                     "cuda-bindings", "cuda-core", "cuda-pathfinder", "nvidia-cuda-nvrtc",
                     "nvidia-cuda-nvrtc-cu12", "nvidia-nvjitlink", "nvidia-nvjitlink-cu12",
                     "nvidia-nvvm", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-cccl",
                     "nvidia-cuda-cccl-cu12", "nvidia-cuda-crt", "numpy", "ml-dtypes")
    ],
]  # fmt: skip


@pytest.fixture(scope="module")
def cccl_fields(tmp_path_factory) -> dict[str, Any]:
    """Every row's (base, mutated) fields, computed in one child process that imports
    cuda.compute (a stub libcuda where no driver is installed)."""
    import importlib.util

    from tests.child import child_env, run_python
    from tests.libcuda_stub import child_env_or_skip

    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.compute") is None:
        pytest.skip("cuda-cccl (cuda.compute) is not installed")
    env = child_env(**child_env_or_skip(tmp_path_factory))
    rows = {f"{i}": row.code for i, row in enumerate(CCCL_MUTATIONS)}
    code = _CCCL_PRELUDE + (
        f"rows = {rows!r}\nout = {{'base': fields()}}\n"
        "for i, expr in rows.items():\n"
        "    got = eval(expr)\n"
        "    out[i] = got if isinstance(got, list) or got is None else [out['base'], got]\n"
        "print(json.dumps(out))\n"
    )
    return run_python(code, env, cwd=str(tmp_path_factory.mktemp("cccl-cwd")))


@pytest.mark.parametrize(
    "i", range(len(CCCL_MUTATIONS)), ids=[f"{m.covers}:{m.what}" for m in CCCL_MUTATIONS]
)
def test_cccl_key_is_sufficient(i, cccl_fields):
    row = CCCL_MUTATIONS[i]
    if cccl_fields[str(i)] is None:  # no mutation possible here: the field records a value
        assert cccl_fields["base"][row.covers] == "{}.{}".format(*sys.version_info[:2])
        return
    base, mutated = cccl_fields[str(i)]
    assert row.covers in base, f"{row.covers!r} is not a key field: {sorted(base)}"
    assert base != mutated, f"{row.what} did not change the key"
    assert base[row.covers] != mutated.get(row.covers), (
        f"{row.what} changed the key but not the field {row.covers!r} it should"
    )


def test_every_cccl_key_field_has_a_mutation(cccl_fields):
    """A field the cccl key emits (for reduce_into: each argument, each codegen
    distribution) with no row fails."""
    from cuforge.cccl import _key

    covered = {m.covers for m in CCCL_MUTATIONS}
    emitted = set(cccl_fields["base"]) | _labels_in_source(_key.key_fields)
    emitted |= {"version:" + d for d in _cccl_distributions()}
    assert "algorithm" in emitted, emitted  # the source scan still works
    assert emitted <= covered, f"cccl key fields with no mutation row: {emitted - covered}"


# ---------------------------------------------------------------- adapters: cuda.core

#: the base program of the cuda.core adapter: headers through the name's dir, the include
#: path (both spellings) and a pre-include
_CC_SOURCE = '#include "here.h"\n#include "v.h"\n#include <w.h>\n__global__ void k() {}\n'
_CC_FILES = {
    "src/here.h": "#define HERE 1\n",
    "inc/v.h": "#define V 1\n",
    "inc/w.h": "#define W 1\n",
    "inc/p.h": "#define P 1\n",
}


def _options(**over: Any) -> Any:
    """The ProgramOptions fields the header digest reads (a real ProgramOptions needs a
    driver to construct: the digest only reads these attributes)."""
    import types

    from cuforge.cuda_core import _PCH_OPTIONS

    values = {"name": "src/k.cu", "include_path": ["inc"], "pre_include": ["p.h"]}
    values.update({opt: None for opt in _PCH_OPTIONS})
    values.update(over)
    return types.SimpleNamespace(**values)


#: (covers: the option whose headers the row reaches, what, files changed, options changed)
CUDA_CORE_MUTATIONS: list[tuple[str, str, dict[str, str], dict[str, Any]]] = [
    ("name", "a header beside the source (\"here.h\")", {"src/here.h": "#define HERE 2\n"}, {}),
    ("include_path", 'a header via "v.h" and -I', {"inc/v.h": "#define V 2\n"}, {}),
    ("include_path", "a header via <w.h> and -I", {"inc/w.h": "#define W 2\n"}, {}),
    ("include_path", "another include dir shadowing v.h", {"inc0/v.h": "#define V 3\n"},
     {"include_path": ["inc0", "inc"]}),
    ("pre_include", "a pre-included header's byte", {"inc/p.h": "#define P 2\n"}, {}),
]  # fmt: skip


def _cc_digest(root, files: dict[str, str], options: Any) -> bytes | None:
    from cuforge.cuda_core import header_digest

    _materialize(Call(files={**_CC_FILES, **files}), str(root))
    digest, reason = header_digest(_CC_SOURCE, options, cwd=str(root))
    assert digest is not None, reason
    return digest


def _cuda_core_or_skip() -> None:
    try:
        import cuforge.cuda_core  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure: the adapter is unusable here
        pytest.skip(f"cuda.core is not importable ({type(exc).__name__}: {exc})")


@pytest.mark.parametrize(
    "row", CUDA_CORE_MUTATIONS, ids=[f"{r[0]}:{r[1]}" for r in CUDA_CORE_MUTATIONS]
)
def test_cuda_core_header_digest_is_sufficient(row, tmp_path):
    _cuda_core_or_skip()
    _, what, files, over = row
    base = _cc_digest(tmp_path / "a", {}, _options())
    assert base == _cc_digest(tmp_path / "b", {}, _options()), "another checkout path"
    assert base != _cc_digest(tmp_path / "c", files, _options(**over)), what


def test_cuda_core_header_digest_covers_every_option_it_reads(tmp_path):
    """An option the digest reads with no row fails; a precompiled-header option is
    refused (the compile runs uncached), never keyed silently."""
    import inspect
    import re

    _cuda_core_or_skip()
    from cuforge.cuda_core import _PCH_OPTIONS, header_digest

    src = inspect.getsource(header_digest)
    read = set(re.findall(r"options\.(\w+)", src))
    read |= set(re.findall(r'getattr\(options, "(\w+)"', src))
    assert read <= {r[0] for r in CUDA_CORE_MUTATIONS}, read
    _materialize(Call(files=_CC_FILES), str(tmp_path))
    for opt in _PCH_OPTIONS:
        digest, reason = header_digest(_CC_SOURCE, _options(**{opt: "x"}), cwd=str(tmp_path))
        assert digest is None and opt in reason, (opt, reason)


# ---------------------------------------------------------------- explain --remote

_FIELDS = {"dsl": "4.8.1", "arch": "sm_90a", "options": "--opt-level 3", "args": "f32[n]"}


def _blob(cache: Any, fields: dict[str, str], name: str = "gemm") -> None:
    from cuforge.core import blobcache

    blobcache.get_or_build(
        "cute", name, fields, lambda: {"o": b"object"}, lambda files: files["o"], cache=cache
    )


def test_explain_remote_names_the_field_that_differs(tmp_path):
    """A local miss is compared with the nearest entry of the same name in a file://
    remote: the entry whose fields differ least, and the field that differs."""
    from tests.cli.conftest import Cli

    url = "file://" + str(tmp_path / "shared")
    (tmp_path / "shared").mkdir()
    writer = cuforge.Cache(str(tmp_path / "ci"), remotes=[url], memory=False)
    _blob(writer, _FIELDS)  # the nearest entry: only the arch differs
    _blob(writer, {**_FIELDS, "arch": "sm_80", "dsl": "4.7.0"})  # two fields differ
    _blob(writer, {**_FIELDS, "arch": "sm_100a"}, name="other")  # another name
    local = str(tmp_path / "dev")
    _blob(cuforge.Cache(local, memory=False), {**_FIELDS, "arch": "sm_90"})  # a miss

    doc = Cli(local).json("cache", "explain", "--remote", url)
    (miss,) = doc["misses"]
    (near,) = miss["nearest"]
    assert near["problem"] is None and near["kind"] == "cute", near
    assert near["differs"] == ["arch sm_90a -> sm_90"], near
    text = Cli(local)("cache", "explain", "--remote", url).stdout
    assert "arch sm_90a -> sm_90" in text, text

    # a remote that holds nothing of that name, and one that cannot be listed, say so
    empty = tmp_path / "empty"
    empty.mkdir()
    (near,) = Cli(local).json("cache", "explain", "--remote", "file://" + str(empty))["misses"][0][
        "nearest"
    ]
    assert "no entry named 'gemm'" in near["problem"], near


def _remote_with_three(tmp_path, url: str) -> str:
    """A writer fills ``url`` (the nearest entry differs from the miss in its arch alone);
    returns the cache dir of a reader whose last build of "gemm" missed."""
    writer = cuforge.Cache(str(tmp_path / "ci"), remotes=[url], memory=False)
    _blob(writer, _FIELDS)
    _blob(writer, {**_FIELDS, "arch": "sm_80", "dsl": "4.7.0"})
    _blob(writer, {**_FIELDS, "arch": "sm_100a"}, name="other")
    local = str(tmp_path / "dev")
    _blob(cuforge.Cache(local, memory=False), {**_FIELDS, "arch": "sm_90"})
    return local


def test_explain_remote_lists_redis_by_scan(tmp_path, redis_server, monkeypatch):
    """Redis keeps no index of names: explain --remote SCANs the namespace (no push index
    needed), capped at SCAN_LIMIT keys, and says when the cap stopped it."""
    from cuforge.cli.cache import _remote_entries
    from cuforge.store.remote import redis as redis_backend
    from cuforge.store.remote import sync
    from tests.cli.conftest import Cli

    local = _remote_with_three(tmp_path, redis_server.url)
    doc = Cli(local).json("cache", "explain", "--remote", redis_server.url)
    (near,) = doc["misses"][0]["nearest"]
    assert near["problem"] is None and near["note"] is None, near
    assert near["differs"] == ["arch sm_90a -> sm_90"], near

    (remote,) = sync.open_targets([redis_server.url])
    label, entries, problem, note = _remote_entries(remote)
    assert problem is None and note is None and len(entries) == 3, (problem, note, entries)
    redis_server.client().set(b"cuforge:other-ns:cute:" + b"a" * 64, b"x")  # another namespace
    redis_server.client().set(b"cuforge:default:lease:cute:" + b"a" * 64, b"1 x")  # a lease
    assert len(remote.backend.scan_keys()[0]) == 3
    monkeypatch.setattr(redis_backend, "SCAN_LIMIT", 1)
    label, entries, problem, note = _remote_entries(remote)
    assert problem is None and "stopped after" in note and len(entries) < 3, (note, entries)


def test_explain_remote_on_http_reads_the_push_index_and_says_so(tmp_path, nginx_server):
    """HTTP has no listing: explain --remote reads the push index, and says so."""
    import hashlib

    from cuforge.keys.explain import fields_of, recent_misses
    from cuforge.store.base import Entry
    from cuforge.store.remote import sync
    from tests.cli.conftest import Cli

    local = str(tmp_path / "dev")
    _blob(cuforge.Cache(local, memory=False), {**_FIELDS, "arch": "sm_90"})  # a miss
    (miss,) = recent_misses(local)
    recorded = fields_of(local, "gemm", miss["key"])
    # kernels pushed by `cuforge cache push` (its index lists the kinds it copies)
    (remote,) = sync.open_targets([nginx_server.url])
    pairs = []
    for name, over in (("gemm", {"arch": "sm_90a"}), ("gemm", {"arch": "sm_80", "dsl": "x"}),
                       ("other", {})):  # fmt: skip
        fields = {**recorded, **over}
        key = hashlib.sha256(repr((name, fields)).encode()).hexdigest()
        meta = {"name": name, "key_fields": fields, "backend": "nvrtc", "output": "cubin"}
        assert remote.put(Entry(key, "kernel", b"cubin", meta)) is not False
        pairs.append(("kernel", key))
    assert sync._write_index(remote, sync.DEFAULT_INDEX, pairs)

    doc = Cli(local).json("cache", "explain", "--remote", nginx_server.url)
    (near,) = doc["misses"][0]["nearest"]
    assert near["differs"] == ["arch sm_90a -> sm_90"], near
    assert "HTTP has no listing" in near["note"], near
    text = Cli(local)("cache", "explain", "--remote", nginx_server.url).stdout
    assert "push index" in text, text


# ---------------------------------------------------------------- stable, for any kind

_STABLE_HARNESS = """
import json, os, sys
ROOT, ORDER = sys.argv[1], sys.argv[2]
{code}
LABELS = sorted(KEYS)[::-1] if ORDER == "reversed" else sorted(KEYS)
print(json.dumps({{label: KEYS[label]() for label in LABELS}}, sort_keys=True))
"""


def check_stable(tmp_path, code: str, files: dict[str, str], *, pythonpath: str = "") -> None:
    """Run ``code`` in a fresh process under each of :data:`PERTURBATIONS` (all at once)
    and assert that each gives what a baseline process gives.

    ``code`` defines ``KEYS``: label -> a function returning that input's key (JSON); it
    reads ``ROOT``, the checkout holding ``files`` (also the cwd), and the harness calls the
    functions in the order the perturbation asks ("build order" reverses it)."""
    script = tmp_path / "stable_child.py"
    script.write_text(_STABLE_HARNESS.format(code=code))
    alias = tmp_path / "venv-alias"
    if not alias.exists():
        alias.symlink_to(sys.prefix)  # the same venv reached through another prefix path
    homes = {
        "HOME": str(tmp_path / "home2"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg-cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg-config"),
        "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
    }
    hostname_ok = os.geteuid() == 0 and shutil.which("unshare") is not None
    runs: dict[str, dict[str, Any]] = {
        "baseline": {},
        "PYTHONHASHSEED": dict(env={"PYTHONHASHSEED": "12345"}),
        "HOME and XDG dirs": dict(env=homes),
        "venv prefix": dict(python=str(alias / "bin" / os.path.basename(sys.executable))),
        "checkout path and cwd": dict(root=str(tmp_path / "elsewhere" / "clone")),
        "build order": dict(order="reversed"),
        "host name and pid": dict(host="other-host") if hostname_ok else {},
        "cache dir": dict(env={"CUFORGE_CACHE_DIR": str(tmp_path / "cache-other")}),
    }
    assert set(runs) - {"baseline"} == set(PERTURBATIONS)
    for kw in runs.values():  # every checkout is written before any child reads one
        _materialize(Call(files=files), kw.get("root", str(tmp_path / "checkout")))
    procs = {}
    for name, kw in runs.items():
        root = kw.get("root", str(tmp_path / "checkout"))
        environ = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
        environ.update(
            PYTHONPATH=os.pathsep.join(p for p in (SRC, pythonpath) if p),
            PYTHONHASHSEED="0",
            CUFORGE_CACHE_DIR=str(tmp_path / "cache-base"),
        )
        environ.update(kw.get("env", {}))
        cmd = [kw.get("python", sys.executable), str(script), root, kw.get("order", "sorted")]
        if "host" in kw:
            cmd = [
                "unshare",
                "--uts",
                "sh",
                "-c",
                f'hostname {kw["host"]} && exec "$@"',
                "sh",
                *cmd,
            ]
        procs[name] = subprocess.Popen(
            cmd, cwd=root, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    got = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {err[-2000:]}"
        got[name] = json.loads(out.strip().splitlines()[-1])
    base = got.pop("baseline")
    differ = {name: keys for name, keys in got.items() if keys != base}
    assert not differ, f"keys changed under {sorted(differ)}: {differ} vs {base}"


def _check_key_row(row: BlobMutation, monkeypatch, key: str = "<key>") -> None:
    """A row of an adapter's table: its field and the entry key ``fields[key]`` differ."""
    base, mutated = row.fields(monkeypatch)
    if row.not_here is not None:
        assert base.get(row.covers), row.not_here
        return
    assert mutated is not None, row.what
    assert row.covers in base or row.covers in mutated, (
        f"{row.covers!r} is not a key field: {sorted(base)}"
    )
    assert base[key] != mutated[key], f"{row.what} did not change the key"
    assert base.get(row.covers) != mutated.get(row.covers), (
        f"{row.what} changed the key but not the field {row.covers!r} it should"
    )


def _entry_key_labels(fn: Callable) -> set[str]:
    """The labels of the field dict an adapter's ``entry_key`` passes to ``make_key``."""
    import inspect

    return set(re.findall(r'make_key\(KIND, \{"(\w+)":', inspect.getsource(fn)))


# ---------------------------------------------------------------- adapters: JAX

#: two JAX cache keys (``jit_<name>-<sha256>``: JAX's key covers the computation, the
#: compile options, the backend and the jax / jaxlib versions; cuforge adds nothing)
_JAX_KEY = "jit_f-" + "a" * 64


def _jax_fields(key: str) -> dict:
    from cuforge.jax import entry_key

    return {"jax_key": key, "<key>": entry_key(key)}


JAX_MUTATIONS: list[BlobMutation] = [
    BlobMutation("jax_key", "one digit of JAX's key", lambda mp: (
        _jax_fields(_JAX_KEY), _jax_fields(_JAX_KEY[:-1] + "b"))),
    BlobMutation("jax_key", "another function name", lambda mp: (
        _jax_fields(_JAX_KEY), _jax_fields(_JAX_KEY.replace("jit_f", "jit_g")))),
]  # fmt: skip


@pytest.mark.parametrize("row", JAX_MUTATIONS, ids=[f"{m.covers}:{m.what}" for m in JAX_MUTATIONS])
def test_jax_key_is_sufficient(row, monkeypatch):
    """Needs no JAX: the entry key is a pure function of JAX's key."""
    _check_key_row(row, monkeypatch)


def test_every_jax_key_field_has_a_mutation():
    from cuforge.jax import entry_key

    emitted = _entry_key_labels(entry_key)
    assert emitted, "the source scan of cuforge.jax.entry_key found no field"
    assert emitted <= {m.covers for m in JAX_MUTATIONS}, emitted


# ---------------------------------------------------------------- adapters: CuPy

#: a CuPy source reaching headers through the cwd, an ``include_dirs`` dir and a ``-I`` of
#: the compile's options
_CUPY_SOURCE = (
    '#include "cwd.h"\n#include "v.h"\n#include "o.h"\nextern "C" __global__ void k() {}\n'
)
_CUPY_FILES = {"cwd.h": "#define C 1\n", "inc/v.h": "#define V 1\n", "opt/o.h": "#define O 1\n"}


def _cupy_fields(name: str = "k.cubin", files: dict[str, str] | None = None) -> dict:
    """CuPy's entry for ``name``: its key, and the headers ``save`` records (what ``load``
    checks), in a fresh checkout holding ``files`` over the base ones."""
    import tempfile

    from cuforge import cupy as ccupy

    root = tempfile.mkdtemp(prefix="cuforge-cert-cupy-")
    try:
        _materialize(Call(files={**_CUPY_FILES, **(files or {})}), root)
        old = os.getcwd()
        os.chdir(root)  # the cwd is one of the roots CuPy's headers are found in
        token = ccupy._option_dirs.set(ccupy._split_option_dirs(["-I" + os.path.join(root, "opt")]))
        try:
            headers = ccupy.headers_of(_CUPY_SOURCE, [os.path.join(root, "inc")])
        finally:
            ccupy._option_dirs.reset(token)
            os.chdir(old)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    key = ccupy.entry_key(name)
    return {
        "cupy_name": name,
        "<key>": key,
        "headers": json.dumps(headers),
        "<load>": key + json.dumps(headers),
    }


CUPY_MUTATIONS: list[BlobMutation] = [
    BlobMutation("cupy_name", "another CuPy kernel name (CuPy's name covers the source, the "
                 "options, the arch, NVRTC and CuPy's own headers)", lambda mp: (
        _cupy_fields(), _cupy_fields("k2.cubin"))),
    BlobMutation("headers", "a header byte via the cwd", lambda mp: (
        _cupy_fields(), _cupy_fields(files={"cwd.h": "#define C 2\n"}))),
    BlobMutation("headers", "a header byte via include_dirs", lambda mp: (
        _cupy_fields(), _cupy_fields(files={"inc/v.h": "#define V 2\n"}))),
    BlobMutation("headers", "a header byte via -I in the compile's options", lambda mp: (
        _cupy_fields(), _cupy_fields(files={"opt/o.h": "#define O 2\n"}))),
]  # fmt: skip


@pytest.mark.parametrize(
    "row", CUPY_MUTATIONS, ids=[f"{m.covers}:{m.what}" for m in CUPY_MUTATIONS]
)
def test_cupy_key_is_sufficient(row, monkeypatch):
    """Needs no CuPy. CuPy's ``load`` gets only the name, so a header edit cannot change
    the key: it changes what ``save`` records, and ``load`` refuses an entry whose recorded
    headers no longer hold (``<load>``: key and record, what decides a hit)."""
    _check_key_row(row, monkeypatch, key="<key>" if row.covers == "cupy_name" else "<load>")


def test_every_cupy_key_field_has_a_mutation():
    from cuforge.cupy import entry_key

    emitted = _entry_key_labels(entry_key) | {"headers"}
    assert "cupy_name" in emitted, "the source scan of cuforge.cupy.entry_key found no field"
    assert emitted <= {m.covers for m in CUPY_MUTATIONS}, emitted
    assert json.loads(_cupy_fields()["headers"]), "no header was recorded"


# ---------------------------------------------------------------- adapters: Triton


def _triton_or_skip() -> None:
    pytest.importorskip("triton", reason="Triton is not installed")
    from cuforge import triton as ct

    if not ct.supported():
        pytest.skip(f"this Triton is outside cuforge.triton.SUPPORTED {ct.SUPPORTED}")


def _triton_fields(
    kernel: str = "add_kernel",
    *,
    constants: dict | None = None,
    signature: dict | None = None,
    attrs: dict | None = None,
    arch: int = 90,
    options: Any = None,
) -> dict:
    """cuforge.triton's key of compiling a tests/adapters/triton kernel (no compile)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from cuforge.triton import key_of
    from tests.adapters.triton import kernels as K

    src = ASTSource(K.KERNELS[kernel], signature or K.SIGNATURE, constants or {"BLOCK": 128}, attrs)
    key, fields = key_of(src, GPUTarget("cuda", arch, 32), options)
    return {**fields, "<key>": key}


#: each field of Triton's backend options (CUDAOptions) and a value that must change the
#: key (None: the generic flip of :func:`_flip`); a field with no row here fails
TRITON_OPTIONS: dict[str, Any] = {
    "num_warps": None, "num_ctas": None, "num_stages": None, "warp_size": 64, "maxnreg": 128,
    "ptx_version": 84, "ptx_options": "-v", "ir_override": "/tmp/kernel.ttir",
    "enable_fp_fusion": None, "enable_reflect_ftz": None, "launch_cooperative_grid": None,
    "launch_pdl": None, "supported_fp8_dtypes": None, "deprecated_fp8_dot_operand_dtypes": None,
    "default_dot_input_precision": "ieee", "allowed_dot_input_precisions": None,
    "max_num_imprecise_acc_default": 0, "debug": None, "backend_name": "cuda2",
    "sanitize_overflow": None, "arch": "sm80", "instrumentation_mode": "x",
    "extern_libs": "another libdevice",
}  # fmt: skip


def _flip(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value else 1
    if isinstance(value, tuple):
        return value[:-1] if value else ("x",)
    raise AssertionError(f"no generic mutation of {value!r}: give one in TRITON_OPTIONS")


def _triton_option(name: str) -> Callable[[Any], tuple[dict, dict]]:
    def pair(monkeypatch):
        import dataclasses
        import tempfile

        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend

        base = _triton_fields()
        options = make_backend(GPUTarget("cuda", 90, 32)).parse_options({})
        value = TRITON_OPTIONS[name]
        if name == "extern_libs":  # the libraries' contents are keyed, not their paths
            lib = os.path.join(tempfile.mkdtemp(prefix="cuforge-cert-"), "libdevice.bc")
            with open(lib, "wb") as f:
                f.write(b"another libdevice")
            value = (("libdevice", lib),)
        elif value is None:
            value = _flip(getattr(options, name))
        return base, _triton_fields(options=dataclasses.replace(options, **{name: value}))

    return pair


TRITON_MUTATIONS: list[BlobMutation] = [
    BlobMutation("triton_version", "the Triton version", lambda mp: (_triton_fields(), None),
                 not_here="one Triton per venv: the field records it (and triton_build the "
                 "build's own key, which Triton's key covers)"),
    BlobMutation("triton_build", "the Triton build", lambda mp: (_triton_fields(), None),
                 not_here="one Triton per venv: the field records a digest of "
                 "cuforge.triton.build_key() (tests/adapters/triton/test_build_key.py changes it)"),
    BlobMutation("source", "another kernel body", lambda mp: (
        _triton_fields(), _triton_fields("mul_kernel"))),
    BlobMutation("signature", "an argument's type", lambda mp: (
        _triton_fields(), _triton_fields(signature={"x": "*fp16", "y": "*fp32", "out": "*fp32", "n": "i32"}))),
    BlobMutation("constexpr:BLOCK", "a constexpr's value", lambda mp: (
        _triton_fields(), _triton_fields(constants={"BLOCK": 256}))),
    BlobMutation("attrs", "an argument's divisibility", lambda mp: (
        _triton_fields(), _triton_fields(attrs={(0,): [["tt.divisibility", 16]]}))),
    BlobMutation("target", "sm_90 -> sm_80", lambda mp: (_triton_fields(), _triton_fields(arch=80))),
    BlobMutation("backend", "the backend's arch (its hash: ptxas and the arch)", lambda mp: (
        _triton_fields(), _triton_fields(arch=80))),
    BlobMutation("env", "TRITON_DISABLE_LINE_INFO=1 (a cache-invalidating variable)",
                 lambda mp: (_triton_fields(), None), env={"TRITON_DISABLE_LINE_INFO": "1"}),
    *[
        BlobMutation("options_hash" if name == "extern_libs" else f"option:{name}",
                     f"the option {name}", _triton_option(name))
        for name in TRITON_OPTIONS
    ],
]  # fmt: skip

_TRITON_CHILD = """
import json
from tests.keys.test_key_certification import _triton_fields
print(json.dumps(_triton_fields()))
"""


def _triton_child(env: dict[str, str]) -> dict:
    from tests.child import run_python
    from tests.conftest import ROOT

    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join([SRC, ROOT])
    environ.update(env)
    return run_python(_TRITON_CHILD, environ, cwd=ROOT)


@pytest.mark.parametrize(
    "row", TRITON_MUTATIONS, ids=[f"{m.covers}:{m.what}" for m in TRITON_MUTATIONS]
)
def test_triton_key_is_sufficient(row, monkeypatch):
    """Triton's own key, computed as ``triton.compile`` computes it (no compile)."""
    _triton_or_skip()
    if row.env is not None:
        base, _ = row.fields(monkeypatch)
        mutated = _triton_child(row.env)
        row = BlobMutation(row.covers, row.what, lambda mp: (base, mutated))
    _check_key_row(row, monkeypatch)


def test_every_triton_key_field_has_a_mutation():
    """A field cuforge.triton labels (or an option Triton's backend keys) with no row fails."""
    import dataclasses

    _triton_or_skip()
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    options = make_backend(GPUTarget("cuda", 90, 32)).parse_options({})
    missing = {f.name for f in dataclasses.fields(options)} - set(TRITON_OPTIONS)
    assert not missing, f"Triton options with no row in TRITON_OPTIONS: {missing}"
    emitted = set(_triton_fields()) - {"<key>"}
    covered = {m.covers for m in TRITON_MUTATIONS} | {"triton_hash"}  # every row changes it
    assert emitted <= covered, f"triton key fields with no mutation row: {emitted - covered}"


# ---------------------------------------------------------------- adapters: stable

_ADAPTERS_CHILD = """
import importlib.util
from cuforge import cupy as ccupy, jax as cjax

def cupy():
    token = ccupy._option_dirs.set(ccupy._split_option_dirs(["-I" + os.path.join(ROOT, "opt")]))
    try:
        return [ccupy.entry_key("k.cubin"), ccupy.headers_of(SOURCE, [os.path.join(ROOT, "inc")])]
    finally:
        ccupy._option_dirs.reset(token)

def triton():
    if importlib.util.find_spec("triton") is None:
        return None
    from tests.keys.test_key_certification import _triton_fields
    return _triton_fields()

SOURCE = {source!r}
KEYS = {{
    "a": lambda: cjax.entry_key("jit_f-" + "a" * 64),
    "b": cupy,
    "c": triton,
}}
"""


def test_adapter_keys_are_stable(tmp_path):
    """The JAX, CuPy and Triton keys (and CuPy's header record) under each perturbation."""
    from tests.conftest import ROOT

    code = _ADAPTERS_CHILD.format(source=_CUPY_SOURCE)
    check_stable(tmp_path, code, _CUPY_FILES, pythonpath=ROOT)
