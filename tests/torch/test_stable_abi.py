"""Stable-ABI torch extensions (``-DTORCH_TARGET_VERSION``, only ``torch/csrc/stable/`` and
``torch/headeronly/`` headers) are keyed by their ABI target: one build serves another
torch release, proven with torch 2.15 in a child (compiler runs counted by the wrapped
c++). An extension that also reads a non-stable torch header rebuilds there."""

from __future__ import annotations

import json
import os

import pytest

from tests.child import ROOT, SRC, run_python

TARGET = "-DTORCH_TARGET_VERSION=0x020a000000000000"  # the stable ABI of torch 2.10

STABLE_SOURCE = """
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>
#include "TAG_HEADER"

using torch::stable::Tensor;

Tensor twice(Tensor x) {
  Tensor c = torch::stable::contiguous(x);
  Tensor out = torch::stable::empty_like(c);
  const float* src = static_cast<const float*>(c.const_data_ptr());
  float* dst = static_cast<float*>(out.mutable_data_ptr());
  for (int64_t i = 0; i < c.numel(); ++i) dst[i] = FACTOR * src[i];
  return out;
}

STABLE_TORCH_LIBRARY(NAMESPACE, m) { m.def("twice(Tensor x) -> Tensor"); }

STABLE_TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("twice", TORCH_BOX(&twice)); }
"""


def _write(root, name: str, *, extra_include: str = "", factor: str = "2.0f") -> str:
    """A stable-ABI op library ``name`` (op ``torch.ops.<name>.twice``) in ``root``; its
    user header ``tag.h`` holds ``extra_include`` (so a non-stable torch header can hide
    behind a user header)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tag.h").write_text(f"#pragma once\n{extra_include}\n#define FACTOR {factor}\n")
    text = STABLE_SOURCE.replace("TAG_HEADER", "tag.h").replace("NAMESPACE", name)
    source = root / f"{name}.cpp"
    source.write_text(text)
    return str(source)


def _spec(name: str, source: str, flags=(TARGET,)):
    from cuforge.torch import BuildSpec

    return BuildSpec(name, [source], extra_cflags=list(flags), is_python_module=False)


# ------------------------------------------------------------------ detection (no compiler)


def test_the_target_define_is_read_from_the_flags():
    from cuforge.torch.stable_abi import parse_target, target_of

    assert target_of(["-O2", TARGET]) == "0x020a000000000000"
    assert target_of(["-D", "TORCH_TARGET_VERSION=0x0209000000000000ULL"]) == (
        "0x0209000000000000ULL"
    )
    assert target_of([TARGET, "-UTORCH_TARGET_VERSION"]) == ""
    assert target_of(["-DTORCH_TARGET_VERSIONX=1"]) is None
    assert parse_target("0x0209000000000000ULL") == 0x0209000000000000
    assert parse_target("(0x020a000000000000)") == 0x020A000000000000
    assert parse_target("(((0ULL + 2) << 56) | ((0ULL + 9) << 48))") is None


def test_a_stable_source_is_keyed_by_its_target_not_by_torch(tmp_path):
    from cuforge.torch.build import plan

    p = plan(_spec("cf_stable_plan", _write(tmp_path / "a", "cf_stable_plan")))
    assert p.abi_target == "2.10 (0x020a000000000000)"
    assert p.load_fields["torch"] == "stable-abi=2.10 (0x020a000000000000)"
    assert p.tus[0].key.fields["torch"] == "stable-abi=2.10 (0x020a000000000000)"


@pytest.mark.parametrize(
    "why, extra_include, flags",
    [
        ("no target define", "", ()),
        ("a target newer than this torch", "", ("-DTORCH_TARGET_VERSION=0x7f00000000000000",)),
        (
            "a target cuforge does not evaluate",
            "",
            ("-DTORCH_TARGET_VERSION=TORCH_VERSION_2_10_0",),
        ),
        ("a non-stable torch header behind a user header", "#include <ATen/Tensor.h>", (TARGET,)),
        ("torch's full API", "#include <torch/extension.h>", (TARGET,)),
        ("c10 (not header-only)", "#include <c10/core/Device.h>", (TARGET,)),
        ("pybind11 (in torch's include dir)", "#include <pybind11/pybind11.h>", (TARGET,)),
        ("a computed include", "#define H <vector>\n#include H", (TARGET,)),
    ],
)
def test_anything_else_keeps_the_exact_torch_key(tmp_path, why, extra_include, flags):
    import torch

    from cuforge.torch.build import plan

    source = _write(tmp_path / "b", "cf_not_stable", extra_include=extra_include)
    p = plan(_spec("cf_not_stable", source, flags))
    assert p.abi_target is None, why
    assert p.load_fields["torch"].startswith(f"{torch.__version__} git="), why


# ------------------------------------------------------------------ across torch releases


def _other_torch() -> str:
    """A ``pip --target`` folder with another torch release of the same stable ABI
    (``TEST_TORCH_OTHER``, else ``.compat/torch-2.15.0`` of this checkout:
    ``make test-compat`` installs it)."""
    candidates = [os.environ.get("TEST_TORCH_OTHER", "")]
    candidates.append(os.path.join(ROOT, ".compat", "torch-2.15.0"))
    for path in candidates:
        if path and os.path.isfile(os.path.join(path, "torch", "version.py")):
            return path
    pytest.skip("no other torch release (set TEST_TORCH_OTHER to a --target folder)")


_CHILD = """
import json, torch
from cuforge.torch import load
from cuforge.torch.build import last_build
load(NAME, [SOURCE], extra_cflags=FLAGS, is_python_module=False)
op = getattr(torch.ops, NAME).twice
print(json.dumps({"torch": torch.__version__, "source": last_build["source"],
                  "out": op(torch.arange(3.0)).tolist()}))
"""


def _in_other_torch(other: str, name: str, source: str, flags) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([other, SRC, ROOT])
    code = _CHILD.replace("NAME", json.dumps(name)).replace("SOURCE", json.dumps(source))
    return run_python(code.replace("FLAGS", json.dumps(list(flags))), env)


def _build_here(name: str, source: str, flags) -> list[float]:
    import torch

    from cuforge.torch import load
    from cuforge.torch.build import last_build

    load(name, [source], extra_cflags=list(flags), is_python_module=False)
    assert last_build["source"] == "built"
    return getattr(torch.ops, name).twice(torch.arange(3.0)).tolist()


@pytest.mark.slow
def test_one_stable_build_serves_another_torch_release_with_no_compile(tmp_path, torch_env):
    import torch

    other = _other_torch()
    name = f"cf_stable_{os.getpid()}_{tmp_path.name[-8:]}".replace("-", "_")
    source = _write(tmp_path / "ext", name, factor="3.0f")
    assert _build_here(name, source, [TARGET]) == [0.0, 3.0, 6.0]
    assert torch_env.compiles() == 1 and torch_env.links() == 1
    torch_env.reset()

    got = _in_other_torch(other, name, source, [TARGET])
    assert got["torch"].split("+")[0] != torch.__version__.split("+")[0]
    assert got["source"] == "cache"
    assert got["out"] == [0.0, 3.0, 6.0]
    assert torch_env.compiles() == 0 and torch_env.links() == 0


@pytest.mark.slow
def test_a_build_that_reads_a_non_stable_torch_header_rebuilds_in_another_release(
    tmp_path, torch_env
):
    other = _other_torch()
    name = f"cf_unstable_{os.getpid()}_{tmp_path.name[-8:]}".replace("-", "_")
    # torch's own non-stable headers refuse TORCH_TARGET_VERSION (#error); pybind11, in
    # torch's include dir too, does not, and its ABI is no part of torch's stable one
    source = _write(tmp_path / "ext", name, extra_include="#include <pybind11/pybind11.h>")
    assert _build_here(name, source, [TARGET]) == [0.0, 2.0, 4.0]
    assert torch_env.compiles() == 1
    torch_env.reset()

    got = _in_other_torch(other, name, source, [TARGET])
    assert got["source"] == "built"
    assert got["out"] == [0.0, 2.0, 4.0]
    assert torch_env.compiles() == 1 and torch_env.links() == 1
