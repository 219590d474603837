"""The one scalar-type table is consistent, and every view derived from it agrees with it."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from cuforge.base.scalar_types import BY_C_NAME, BY_CODE, BY_DTYPE, ELEMENT_KINDS, SCALAR_TYPES
from cuforge.frontend import jitkernel
from cuforge.runtime import args as argmod
from cuforge.runtime import signature
from cuforge.runtime.fastlaunch import KINDS
from cuforge.torch import binding, custom_ops

_IDS = [t.dtype for t in SCALAR_TYPES]


def test_keys_are_unique_and_map_back():
    assert len(BY_CODE) == len(SCALAR_TYPES)
    assert len({t.dtype for t in SCALAR_TYPES}) == len(SCALAR_TYPES)
    assert len({t.cxx for t in SCALAR_TYPES}) == len(SCALAR_TYPES)
    # no C spelling belongs to two types
    assert len(BY_C_NAME) == sum(len(t.c_names) for t in SCALAR_TYPES)
    for t in SCALAR_TYPES:
        assert BY_CODE[t.code] is t
        assert BY_DTYPE[t.dtype] is t
        for name in t.dtype_aliases:
            assert BY_DTYPE[name] is t
        for name in t.c_names:
            assert BY_C_NAME[name] is t, name
        # ATen spellings are a torch launcher's, never a kernel parameter's
        assert not set(t.aten_names) & set(BY_C_NAME)
    kinds = [k.letter for k in ELEMENT_KINDS]
    assert len(set(kinds)) == len(kinds)
    assert len({k.dlpack for k in ELEMENT_KINDS}) == len(ELEMENT_KINDS)


@pytest.mark.parametrize("t", SCALAR_TYPES, ids=_IDS)
def test_sizes_formats_and_kinds(t):
    assert struct.calcsize("<" + t.fmt) == t.size
    assert t.kind in {k.letter for k in ELEMENT_KINDS}
    # an array of the type's own dtype is accepted for a pointer to it
    assert (t.kind, t.size) in t.element_kinds
    prefix = next(k.prefix for k in ELEMENT_KINDS if k.letter == t.kind)
    assert t.dtype == (prefix if t.kind == "b" else f"{prefix}{t.size * 8}")
    assert t.torch_cpp.startswith("torch::k")


@pytest.mark.parametrize("t", SCALAR_TYPES, ids=_IDS)
def test_signature_view(t):
    assert signature.SCALAR_CODES[t.code] == (t.fmt, t.size)
    for name in t.c_names:
        p = signature.parse_param(0, f"{name} x")
        assert (p.kind, p.code, p.size) == ("scalar", t.code, t.size), name
        p = signature.parse_param(0, f"const {name}* x")
        assert (p.kind, p.code) == ("pointer", t.code), name


@pytest.mark.parametrize("t", SCALAR_TYPES, ids=_IDS)
def test_args_view(t):
    assert argmod._POINTEE_ACCEPTS[t.code] == t.element_kinds
    layout = argmod.Layout([signature.parse_param(0, f"{t.cxx} x")])
    assert layout.format == "<" + t.fmt and layout.size == t.size
    if t.kind == "bf":
        assert t.code not in argmod.NUMPY_DTYPE_NAMES
    else:
        assert argmod.NUMPY_DTYPE_NAMES[t.code] == t.torch_dtype
    family = next(k for k in ELEMENT_KINDS if k.letter == t.kind)
    assert argmod._DL_CODES[family.dlpack] == t.kind
    assert argmod.element_kind_names((t.kind, t.size)) == t.dtype


@pytest.mark.parametrize("t", SCALAR_TYPES, ids=_IDS)
def test_jit_view(t):
    # dtype names, the C++ type and its aliases all specialize to the one C++ type, which
    # the signature reader maps back to the same code (so the launch packs it as the dtype)
    for name in (t.dtype, *t.dtype_aliases, t.cxx, *t.cxx_aliases):
        assert jitkernel.cxx_type(name) == t.cxx, name
    assert BY_C_NAME[t.cxx] is t
    family = next(k for k in ELEMENT_KINDS if k.letter == t.kind)
    assert jitkernel.cxx_type((family.dlpack, t.size * 8, 1)) == t.cxx
    assert jitkernel._HEADER_FOR.get(t.cxx) == t.header
    assert t.dtype in jitkernel._SUPPORTED


@pytest.mark.parametrize("t", SCALAR_TYPES, ids=_IDS)
def test_custom_op_view(t):
    assert custom_ops._SCALAR_SCHEMA[t.code] == t.schema
    assert custom_ops._SCHEMA_KINDS[t.schema] in ("int", "float", "bool")


def test_binding_view():
    for name, constant in binding._DTYPES.items():
        t = BY_C_NAME.get(name) or next(t for t in SCALAR_TYPES if name in t.aten_names)
        assert constant == t.torch_cpp, name
    for name in binding._INTS:
        assert BY_C_NAME[name].kind in ("i", "u"), name


def test_fastlaunch_kinds_are_table_codes():
    assert set(KINDS) - {"ptr"} <= set(BY_CODE)


def test_torch_dtypes_agree():
    torch = pytest.importorskip("torch")
    for t in SCALAR_TYPES:
        dtype = argmod.torch_dtype_for(t.code, torch)
        assert dtype is getattr(torch, t.torch_dtype)
        assert dtype.itemsize == t.size
        # a tensor of the pointer's torch dtype is accepted for it, and names the C++ type
        # jit specializes with (the signed one where torch has no unsigned dtype)
        assert argmod._torch_kind(dtype) in t.element_kinds
        assert BY_DTYPE[t.torch_dtype].size == t.size
        x = torch.zeros(2, dtype=dtype)
        code, bits, lanes = argmod.dlpack_dtype(x)
        assert (argmod._DL_CODES[code], bits // 8, lanes) == (
            BY_DTYPE[t.torch_dtype].kind,
            t.size,
            1,
        )
        assert jitkernel.cxx_type(dtype) == BY_DTYPE[t.torch_dtype].cxx


def test_numpy_dtypes_agree():
    np = pytest.importorskip("numpy")
    for t in SCALAR_TYPES:
        name = argmod.NUMPY_DTYPE_NAMES.get(t.code)
        if name is None:
            continue
        dtype = np.dtype(name)
        assert argmod._numpy_kind(dtype) in t.element_kinds
        assert argmod._typestr_kind(dtype.str) in t.element_kinds
        assert jitkernel.cxx_type(np.dtype(t.dtype)) == t.cxx
        assert jitkernel.cxx_type(np.dtype(t.dtype).type) == t.cxx


def test_the_table_imports_nothing_heavy():
    code = (
        "import sys, cuforge.base.scalar_types; "
        "heavy = {'torch', 'numpy', 'typing', 'json', 'importlib.util'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    code = "import sys, cuforge; assert 'cuforge.base.scalar_types' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
