"""Device arrays an operator reaches, and which of them end up in the machine code.

cuda.compute passes as runtime state (a pointer set at each call) only the device arrays
the operator itself names as a global or closure variable; numba compiles any other array
it reaches (a ``@cuda.jit(device=True)`` helper's global, a nested function's closure, a
default argument) in as a constant address. Two real processes, each with a device array at
its own address (an object exposing ``__cuda_array_interface__``: no GPU is needed to build
for an explicit compute capability), check that the first kind still hits across processes
and that the second never shares an entry."""

from __future__ import annotations

import functools
import importlib.util

import pytest

from tests.cccl.conftest import run_child

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numba_cuda_mlir") is None,
    reason="numba-cuda-mlir (cuda.compute's Python-operator compiler) is not installed",
)

#: the operators, as a module file (cuda.compute reads a stateful operator's source);
#: ADDRESS is the (fake) device address of TABLE in this process
OPS = """
import os
from types import SimpleNamespace

import numpy as np
from numba_cuda_mlir import cuda


class DeviceArray:  # what torch / CuPy arrays expose; nothing here reads the address
    def __init__(self, address, n=16):
        self.__cuda_array_interface__ = {"data": (address, False), "shape": (n,),
                                         "typestr": "<i4", "version": 3, "strides": None}


TABLE = DeviceArray(int(os.environ["ADDRESS"], 16))
HOLDER = SimpleNamespace(table=TABLE)


@cuda.jit(device=True)
def helper(x):
    return x + TABLE[0]


def direct(a, b):  # cuda.compute passes TABLE as state
    return a + b + TABLE[0]


def via_helper(a, b):  # TABLE is compiled into helper
    return helper(a) + b


def both(a, b):  # state here, but compiled into helper all the same
    return helper(a) + b + TABLE[0]


def make_closure(arr):
    def op(a, b):
        return a + b + arr[0]
    return op


def make_nested(arr):
    def inner(x):
        return x + arr[0]
    def op(a, b):
        return inner(a) + b
    return op


def with_default(a, b, t=TABLE):
    return a + b + t[0]


def through_object(a, b):
    return a + b + HOLDER.table[0]


def unary(x: np.int32) -> np.int32:
    return x + TABLE[0]
"""

#: what each process runs, with OPS importable as ``pointer_ops``
CODE = """
    from cuforge.keys.fingerprint import UnstableKeyError
    from cuforge.cccl._key import state_arrays
    from cuda.compute._jit import _detect_all_device_arrays
    sys.path.insert(0, os.getcwd())
    from pointer_ops import *

    def key(op, **extra):
        try:
            return cccl.key_of("make_reduce_into", **dict(reduce_args(op=op), **extra))[0]
        except UnstableKeyError as exc:
            return {"what": exc.what, "path": exc.path, "msg": str(exc)}

    ops = {"direct": direct, "closure": make_closure(TABLE), "via_helper": via_helper,
           "both": both, "nested": make_nested(TABLE), "default": with_default,
           "object": through_object}
    keys = {name: key(op) for name, op in ops.items()}
    it = cc.TransformIterator(cc.CountingIterator(np.int32(0)), unary)
    keys["iterator"] = key(cc.OpKind.PLUS, d_in=it)
    agree = all(sorted(n for n, _ in _detect_all_device_arrays(f))
                == sorted(state_arrays(f)[0] | state_arrays(f)[1]) for f in ops.values())

    cccl.make_reduce_into(**reduce_args(op=direct))
    built = {"direct": last()}
    if os.environ.get("BUILD_HELPER"):
        cccl.make_reduce_into(**reduce_args(op=via_helper))
        built["via_helper"] = last()
        from cuforge import default_cache
        built["via_helper"]["stored"] = default_cache().store.get(last()["key"]) is not None
    emit({"keys": keys, "agree": agree, "built": built,
          "compiled": blobcache.counters.get("cccl:compiled", 0)})
"""


@pytest.fixture(scope="module")
def two_processes(cuda_env, tmp_path_factory) -> tuple[dict, dict]:
    """Process A (TABLE at one address) builds, then process B (TABLE elsewhere) runs the
    same code against the same cache dir."""
    cache_dir = str(tmp_path_factory.mktemp("cccl-pointers"))
    src = tmp_path_factory.mktemp("cccl-pointer-ops")
    (src / "pointer_ops.py").write_text(OPS)
    run = functools.partial(run_child, CODE, cuda_env, cache_dir, cwd=str(src))
    a = run(ADDRESS="7f0000001000", BUILD_HELPER="1")
    b = run(ADDRESS="7f00000a2000")
    return a, b


def test_an_array_the_op_names_itself_is_state_and_hits_across_processes(two_processes):
    a, b = two_processes
    assert a["agree"] and b["agree"]  # the same arrays as cuda.compute's own detection
    for name in ("direct", "closure", "iterator"):
        assert isinstance(a["keys"][name], str), a["keys"][name]
        assert a["keys"][name] == b["keys"][name]  # dtype and shape, not the address
    assert a["built"]["direct"]["source"] == "compiled"
    assert b["built"]["direct"]["source"] == "disk"  # another address, the same entry
    assert b["built"]["direct"]["key"] == a["built"]["direct"]["key"]
    assert b["compiled"] == 0


def test_an_array_compiled_into_the_code_never_shares_an_entry(two_processes):
    a, b = two_processes
    paths = {
        "via_helper": "op.__globals__['helper'].py_func.__globals__['TABLE']",
        "both": "op.__globals__['helper'].py_func.__globals__['TABLE']",
        "nested": "op.<closure inner>.<closure arr>",
        "default": "op.__defaults__[0]",
    }
    for out in (a, b):
        for name, path in paths.items():
            err = out["keys"][name]
            assert isinstance(err, dict), (name, err)
            assert err["what"] == "op" and err["path"] == path
            assert "bakes its address into the machine code" in err["msg"]
    # the real call runs uncached, says which array, and stores nothing
    helper = a["built"]["via_helper"]
    assert helper["source"] == "uncached" and not helper["stored"]
    assert "py_func.__globals__['TABLE']" in helper["reason"]
    assert "py_func.__globals__['TABLE']" in a["_stderr"]  # warned
    # an array reached any other way (an object's attribute) is keyed by its address
    assert isinstance(a["keys"]["object"], str) and isinstance(b["keys"]["object"], str)
    assert a["keys"]["object"] != b["keys"]["object"]
