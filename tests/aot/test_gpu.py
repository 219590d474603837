"""On a GPU: a kernel served from a loaded bundle in strict mode launches and computes the
right values (the bundle holds the real cubin, not a stand-in)."""

from __future__ import annotations

import json

import pytest

from tests.aot.conftest import cli, python_in

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

LAUNCH = """
import json
import torch
import cuforge
from cuforge.core.pipeline import counters
cuforge.load_bundle(BUNDLE)
prog = cuforge.compile_file("red.cu", include_dirs=["include"], arch=ARCH,
                            name_expressions=["blk<128, float>"], defines={"TILE": "128"})
k = prog.kernel("blk<128, float>")
x = torch.arange(128, device="cuda", dtype=torch.float32)
out = torch.zeros(128, device="cuda")
k[1, 128](out, x)
torch.cuda.synchronize()
ok = torch.equal(out, x * (128 + 128))
print(json.dumps({"ok": bool(ok), "source": prog.source_of_result, "compiles": counters["compiles"]}))
"""


def test_a_bundled_kernel_launches_in_strict_mode(project, tmp_path):
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    (project / "cuforge.toml").write_text(
        (project / "cuforge.toml").read_text().replace('["sm_80", "sm_90"]', f'["{arch}"]')
    )
    bundle = tmp_path / "gpu.cfb"
    done = cli(project, "build", "--jobs", "2", "--bundle", str(bundle), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total"] == 4
    code = f"BUNDLE = {str(bundle)!r}\nARCH = {arch!r}\n" + LAUNCH
    out = python_in(
        project, code, CUFORGE_OFFLINE="1", CUFORGE_CACHE_DIR=str(tmp_path / "empty-cache")
    )
    assert out == {"ok": True, "source": "bundle", "compiles": 0}
