"""On a GPU: the built extension's ops give torch's results (``pytest -m gpu``)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import run_python
from tests.torch.conftest import EXT_NAME

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # builds real extensions


def test_sample_ops_match_torch_on_the_gpu(ext):
    code = f"""
    import json
    import torch
    from cuforge.torch import load
    m = load({EXT_NAME!r}, {ext.sources!r}, build_directory={ext.build_dir!r})
    x = torch.randn(1 << 20 | 3, device="cuda")
    y = torch.randn_like(x)
    ok = {{
        "add": torch.equal(m.add(x, y), x + y),
        "scale": torch.allclose(m.scale(x, 2.5), x * 2.5),
        "relu": torch.equal(m.relu(x), torch.relu(x)),
        "stream": False,
    }}
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z = m.add(x, y)
    s.synchronize()
    ok["stream"] = torch.equal(z, x + y)
    print(json.dumps(ok))
    """
    import textwrap

    got = run_python(textwrap.dedent(code))
    assert got == {"add": True, "scale": True, "relu": True, "stream": True}


def test_torch_library_ops_and_generated_binding_on_the_gpu(ext):
    from cuforge.torch import generate_binding

    gen = os.path.join(os.path.dirname(ext.binding), "generated_binding.cpp")
    generate_binding(
        os.path.join(os.path.dirname(ext.kernels), "kernels.h"),
        ["add", "scale", "relu"],
        output=gen,
        library="cuforge_generated",
    )
    code = f"""
    import json
    import torch
    from cuforge.torch import load
    lib = load({EXT_NAME!r}, {ext.sources!r}, build_directory={ext.build_dir!r},
               is_python_module=False)
    gen = load("cuforge_generated_ext", [{ext.kernels!r}, {gen!r}],
               build_directory={ext.build_dir + "-gen"!r})
    x = torch.randn(4097, device="cuda")
    y = torch.randn_like(x)
    ops = torch.ops.cuforge_sample
    print(json.dumps({{
        "lib_add": torch.equal(ops.add(x, y), x + y),
        "lib_relu": torch.equal(ops.relu(x), torch.relu(x)),
        "gen_add": torch.equal(gen.add(x, y), x + y),
        "gen_scale": torch.allclose(gen.scale(x, -1.5), x * -1.5),
        "gen_op": torch.equal(torch.ops.cuforge_generated.relu(x), torch.relu(x)),
    }}))
    """
    import textwrap

    got = run_python(textwrap.dedent(code), timeout=900)
    assert all(got.values()), got


def test_classic_layout_built_with_the_split_pipeline_on_the_gpu(tmp_path):
    """ops.cu includes torch's headers, so its host and device lanes run in parallel
    (nvcc_split): the kernels registered by the host stub must be the device's."""
    import shutil
    import textwrap

    from cuforge.samples import torch_ext

    root = str(tmp_path / "classic")
    shutil.copytree(torch_ext.SAMPLE_DIR, root)
    sources = torch_ext.sources("classic", root=root)
    code = f"""
    import json
    import torch
    from cuforge.torch import load
    m = load("cuforge_classic_gpu", {sources!r}, build_directory={root + "/build"!r}, split=True)
    x = torch.randn(100003, device="cuda")
    y = torch.randn_like(x)
    print(json.dumps({{
        "add": torch.equal(m.add(x, y), x + y),
        "scale": torch.allclose(m.scale(x, 0.5), x * 0.5),
        "relu": torch.equal(m.relu(x), torch.relu(x)),
    }}))
    """
    got = run_python(textwrap.dedent(code), timeout=1200)
    assert got == {"add": True, "scale": True, "relu": True}
