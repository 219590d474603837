"""cuforge.keys.fingerprint: stable fingerprints of Python objects (the op part of integration keys)."""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import functools
import math
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import cuforge.keys.fingerprint as fpmod
from cuforge.keys.fingerprint import UNHANDLED, UnstableKeyError, fingerprint, module_fingerprint
from tests.conftest import child_env


def fp(obj):
    return fingerprint(obj, what="op")


# -- functions ---------------------------------------------------------------------------

SCALE = 3


def helper(x):
    return x * SCALE


def uses_helper(a, b):
    return helper(a) + b + math.floor(1.5)


def test_same_function_same_fingerprint_and_distinct_functions_differ():
    assert fp(uses_helper) == fp(uses_helper)
    assert fp(lambda a, b: a + b) == fp(lambda a, b: a + b)
    assert fp(lambda a, b: a + b) != fp(lambda a, b: a - b)
    assert fp(lambda a, b: a + b) != fp(lambda a, b: a + b + 1)


def test_a_global_the_code_reads_is_keyed_recursively(monkeypatch):
    before = fp(uses_helper)
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 4)  # read by helper, called by uses_helper
    assert fp(uses_helper) != before
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 3)
    assert fp(uses_helper) == before


def test_a_called_helper_replaced_by_another_changes_the_fingerprint(monkeypatch):
    before = fp(uses_helper)
    monkeypatch.setattr(sys.modules[__name__], "helper", lambda x: x * 3)
    assert fp(uses_helper) != before


def make_adder(v):
    def add(a):
        return a + v

    return add


def test_closure_values_defaults_and_nested_code_are_keyed():
    assert fp(make_adder(1)) == fp(make_adder(1))
    assert fp(make_adder(1)) != fp(make_adder(2))
    assert fp(make_adder(1)) != fp(make_adder(1.0))  # int 1 and float 1.0 compile differently

    def with_default(a, b=2):
        return a + b

    def with_other_default(a, b=3):
        return a + b

    assert fp(with_default) != fp(with_other_default)

    def outer1():
        return lambda: 1

    def outer2():
        return lambda: 2

    assert fp(outer1) != fp(outer2)  # the nested code object's constant differs


def recursive(n):
    return recursive(n - 1) if n else 0


def ping(n):
    return pong(n - 1) if n else 0


def pong(n):
    return ping(n - 1) if n else 1


def test_cycles_are_handled():
    assert fp(recursive) == fp(recursive)
    assert fp(ping) != fp(pong)
    loop: list = [1]
    loop.append(loop)
    assert fp(loop) == fp(loop)


def test_unstable_objects_raise_naming_the_argument_and_path():
    lock = threading.Lock()

    def uses_lock(a):
        return lock

    with pytest.raises(UnstableKeyError) as info:
        fingerprint(uses_lock, what="op")
    err = info.value
    assert err.what == "op"
    assert "<closure lock>" in err.path
    assert "lock" in str(err) and "address" in err.reason

    class Opaque:
        pass

    with pytest.raises(UnstableKeyError):
        fingerprint({"x": Opaque()}, what="h_init")


def test_a_pointer_and_an_object_method_bound_to_an_instance_are_refused():
    with pytest.raises(UnstableKeyError):
        fp(ctypes.pointer(ctypes.c_int(1)))
    with pytest.raises(UnstableKeyError):
        fp(object().__str__)


# -- modules, builtins, installed objects ----------------------------------------------


def test_modules_by_name_and_version():
    assert module_fingerprint(math) == f"math python-{sys.version_info[0]}.{sys.version_info[1]}"
    assert module_fingerprint(np).startswith("numpy numpy==" + np.__version__)
    assert fp(len) != fp(abs)
    assert fp(np.sin) != fp(np.cos)
    assert fp(functools.reduce) == fp(functools.reduce)


def test_a_local_module_is_keyed_by_its_source_contents_not_its_path(tmp_path):
    code = textwrap.dedent(
        """
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("mylocalmod", sys.argv[1])
        mod = importlib.util.module_from_spec(spec); sys.modules["mylocalmod"] = mod
        spec.loader.exec_module(mod)
        from cuforge.keys.fingerprint import fingerprint
        def op(a):
            return mod.f(a)
        print(fingerprint(op, what="op"))
        """
    )
    results = []
    for sub, body in (("a", "def f(x):\n    return x\n"), ("b", "def f(x):\n    return x\n")):
        d = tmp_path / sub
        d.mkdir()
        (d / "mylocalmod.py").write_text(body)
        results.append(_run(code, str(d / "mylocalmod.py")))
    assert results[0] == results[1]  # same contents at two paths: same fingerprint
    (tmp_path / "a" / "mylocalmod.py").write_text("def f(x):\n    return x + 1\n")
    assert _run(code, str(tmp_path / "a" / "mylocalmod.py")) != results[0]


def test_a_namespace_package_of_a_checkout_is_keyed_by_its_files(tmp_path):
    # a checkout on sys.path with no __init__.py (flash_attn/cute): the package object
    # has no __file__; its .py files are hashed by content, not refused
    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, sys.argv[1])
        import nsfp.sub.helpers
        from cuforge.keys.fingerprint import fingerprint
        def op(a):
            return nsfp.sub.helpers.f(a)
        print(fingerprint(op, what="op"))
        """
    )
    results = []
    for sub in ("a", "b"):
        pkg = tmp_path / sub / "nsfp" / "sub"
        pkg.mkdir(parents=True)
        (pkg / "helpers.py").write_text("def f(x):\n    return x\n")
        results.append(_run(code, str(tmp_path / sub)))
    assert results[0] == results[1]  # the same files in two checkouts: the same key
    (tmp_path / "a" / "nsfp" / "sub" / "helpers.py").write_text("def f(x):\n    return x + 1\n")
    assert _run(code, str(tmp_path / "a")) != results[0]


def test_classes_of_an_installed_extensions_submodule_are_keyed_by_its_version():
    # the CuTe DSL's ir.Value / ir.Location live in a nanobind submodule of its compiled
    # extension (no __file__): keyed by the distribution that installed the extension
    ir = pytest.importorskip("cutlass._mlir.ir", reason="the CuTe DSL is not installed")

    class WorkTile:
        def __new_from_mlir_values__(self, values: list[ir.Value]) -> WorkTile:
            return WorkTile()

    def helper(x, *, loc: ir.Location | None = None):
        return WorkTile

    # the objects themselves, as without ``from __future__ import annotations``
    WorkTile.__new_from_mlir_values__.__annotations__ = {"values": list[ir.Value]}
    helper.__annotations__ = {"loc": ir.Location | None}
    assert fp(helper) == fp(helper)
    module = sys.modules[ir.Value.__module__]
    assert getattr(module, "__file__", None) is None
    assert " in cutlass._mlir._mlir_libs._cutlass_ir nvidia-cutlass-dsl" in module_fingerprint(
        module
    )


def _run(code: str, *args: str, seed: str = "0") -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=child_env(PYTHONHASHSEED=seed),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.strip().splitlines()[-1]


def test_stable_across_processes_hash_seeds_and_directories(tmp_path):
    module = textwrap.dedent(
        """
        import enum, dataclasses, math
        import numpy as np
        class Kind(enum.Enum):
            PLUS = 1
        @dataclasses.dataclass(frozen=True)
        class Cfg:
            scale: float
            names: tuple
        CFG = Cfg(2.5, ("a", "b"))
        TABLE = {"k": [1, 2.0, None, b"x"], 3: frozenset({"p", "q", "r"})}
        def helper(x):
            return x * CFG.scale + math.sqrt(2) + np.float32(TABLE[3].__len__())
        def op(a, b):
            return helper(a) + b if Kind.PLUS else b
        """
    )
    code = "import sys; sys.path.insert(0, sys.argv[1]); import opmod; from cuforge.keys.fingerprint import fingerprint; print(fingerprint(opmod.op, what='op'))"
    seen = set()
    for i, sub in enumerate(("one", "two/deeper")):
        d = tmp_path / sub
        d.mkdir(parents=True)
        (d / "opmod.py").write_text(module)
        seen.add(_run(code, str(d), seed=str(i + 1)))
    assert len(seen) == 1


# -- plain data ----------------------------------------------------------------------


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass
class Point:
    x: int
    y: float = 0.0


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int32), ("b", ctypes.c_double)]


class PackedPair(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("a", ctypes.c_int32), ("b", ctypes.c_double)]


def test_plain_data_by_value():
    assert fp((1, "a", 2.0, None, b"x")) == fp((1, "a", 2.0, None, b"x"))
    assert fp(1) != fp(True) != fp(1.0)
    assert fp(0.0) != fp(-0.0)
    assert fp(float("nan")) == fp(float("nan"))
    assert fp([1, 2]) != fp((1, 2))
    assert fp({"a": 1, "b": 2}) != fp({"a": 1, "b": 3})
    assert fp(frozenset({"a", "b", "c"})) == fp(frozenset({"c", "b", "a"}))
    assert fp(Color.RED) != fp(Color.BLUE)
    assert fp(Point(1, 2.0)) != fp(Point(1, 3.0))
    assert fp(Point(1, 2.0)) == fp(Point(1, 2.0))
    assert fp(functools.partial(helper, 1)) != fp(functools.partial(helper, 2))


def test_numpy_and_ctypes_by_layout():
    assert fp(np.dtype(np.float32)) == fp(np.dtype("float32"))
    assert fp(np.dtype(np.float32)) != fp(np.dtype(np.float64))
    aligned = np.dtype([("a", "<i4"), ("b", "<f8")], align=True)
    packed = np.dtype([("a", "<i4"), ("b", "<f8")])
    assert fp(aligned) != fp(packed)
    assert fp(np.float32) != fp(np.int32)
    assert fp(np.arange(4)) != fp(np.arange(5))
    assert fp(np.float32(1)) != fp(np.float64(1))
    assert fp(Pair) != fp(PackedPair)
    assert fp(ctypes.c_int32) != fp(ctypes.c_int64)
    assert fp(Pair(1, 2.0)) != fp(Pair(1, 3.0))


def test_a_hook_replaces_objects_it_knows():
    class Device:
        def __init__(self, dtype):
            self.dtype = dtype

    def hook(obj):
        if isinstance(obj, Device):
            return ("device", obj.dtype)
        return UNHANDLED

    assert fingerprint(Device("f4"), what="x", hook=hook) == fingerprint(
        Device("f4"), what="x", hook=hook
    )
    assert fingerprint(Device("f4"), what="x", hook=hook) != fingerprint(
        Device("f8"), what="x", hook=hook
    )
    with pytest.raises(UnstableKeyError):
        fingerprint(Device("f4"), what="x")


def test_fresh_temporaries_never_alias_by_id():
    # a hook returning a new tuple each time must not make two different objects look like
    # a back-reference to a freed one (ids of dead objects are reused)
    class Box:
        def __init__(self, v):
            self.v = v

    def hook(obj):
        return ("box", obj.v) if isinstance(obj, Box) else UNHANDLED

    a = fingerprint([Box(i) for i in range(50)], what="x", hook=hook)
    b = fingerprint([Box(i) for i in range(49)] + [Box(99)], what="x", hook=hook)
    assert a != b


def test_custom_fingerprint_method():
    class Tagged:
        def __init__(self, tag):
            self.tag = tag

        def __cuforge_fingerprint__(self):
            return ("tagged", self.tag)

    assert fp(Tagged("a")) == fp(Tagged("a")) != fp(Tagged("b"))


def test_importing_fingerprint_does_not_import_numpy_or_ctypes():
    code = "import sys, cuforge.keys.fingerprint; print(sorted(m for m in ('numpy', 'ctypes', 'dis') if m in sys.modules))"
    assert _run(code) == "[]"


def test_registered_types(monkeypatch):
    import cuforge.keys.fingerprint as fpmod

    class Spec:
        def __init__(self, n):
            self.n = n

    monkeypatch.setitem(fpmod._registry, Spec, lambda s: ("spec", s.n))
    assert fp(Spec(1)) != fp(Spec(2))


def test_global_names_read_from_raw_bytecode_match_dis():
    """The bytecode scan that finds the globals a function loads agrees with ``dis`` (in
    order) on real code: the stdlib, cuforge itself, nested functions and comprehensions."""
    import argparse
    import dis
    import json.decoder
    import types

    import cuforge.core.pipeline

    def nested(code):
        yield code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from nested(const)

    checked = 0
    for module in (argparse, json.decoder, cuforge.core.pipeline, fpmod):
        for obj in vars(module).values():
            code = getattr(obj, "__code__", None)
            if not isinstance(code, types.CodeType):
                continue
            want: dict[str, None] = {}
            for c in nested(code):
                for ins in dis.get_instructions(c):
                    if ins.opname in fpmod._GLOBAL_OPS:
                        want[ins.argval] = None
            assert list(fpmod._global_names(code)) == list(want), obj
            checked += 1
    assert checked > 20


def test_distribution_scan_agrees_with_the_standard_library():
    """The fast scan of installed distributions (a new cache dir's fingerprints) names the
    same distributions for every top-level package as importlib.metadata does."""
    from importlib import metadata

    from cuforge.toolchain import installed

    expected = {k: sorted(set(v)) for k, v in metadata.packages_distributions().items()}
    assert installed._scan_distributions() == expected
