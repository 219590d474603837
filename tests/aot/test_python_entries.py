"""Issue 13, section 1 (last bullet): ``[[python]]`` manifest entries build the
``cuda.compute`` (cuforge.cccl) and CuTe DSL (cuforge.cute) integrations ahead of time.

A ``[[python]]`` variant calls a project function (``call = "module:function"``, the module
under the manifest's dir) with its grid point's ``kwargs``. Cheap tests use a function that
compiles a kernel with ``cuforge.compile`` (same contract: hit = nothing built); the
cuda.compute test makes real cuda.compute builds (a few seconds each, 4 in all) against a
stub libcuda, and is skipped without cuda-cccl.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from cuforge.aot.manifest import ManifestError, load_manifest
from cuforge.aot.tasks import run_task
from tests.aot.conftest import cli, python_in

KERN = """\
import cuforge

SRC = 'extern "C" __global__ void k(float* x) { x[0] = %s; }'


def build(value, arch=None):
    if value == "bad":
        raise ValueError("no kernel for value bad")
    cuforge.compile(SRC % value, name="k.cu", arch=arch)
"""

#: a fresh process making the calls the [[python]] variants made: its compile counters
JIT = """
import json, sys
import cuforge
from cuforge.core.pipeline import counters
SRC = 'extern "C" __global__ void k(float* x) { x[0] = %s; }'
out = [cuforge.compile(SRC % v, name="k.cu", arch="sm_90").source_of_result
       for v in sys.argv[1:] or ("1.0f", "2.0f")]
print(json.dumps({"sources": out, "compiles": counters["compiles"]}))
"""


def make_project(tmp_path, manifest: str, files: dict[str, str] | None = None):
    root = tmp_path / "pyproj"
    root.mkdir()
    (root / "kern.py").write_text(KERN)
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "cuforge.toml").write_text(manifest)
    return root


def doc(done) -> dict:
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


# -- the manifest -------------------------------------------------------------------------


def test_python_entries_expand_over_grid_and_arch_with_typed_placeholders(tmp_path):
    root = make_project(
        tmp_path,
        """\
arch = ["sm_80"]            # the top-level arch does not apply to [[python]]

[[python]]
call = "pkg.kern:build"
kwargs = { value = "{V}", block = "{B}", label = "v={V}", nested = { xs = ["{B}", 1] } }
files = ["pkg/util.py", "data/*.txt"]
[python.grid]
V = ["1.0f", "2.0f"]
B = [128, 256]

[[python]]
call = "kern:build"
arch = ["sm_80", "sm_90"]
kwargs = { value = "3.0f" }
""",
        {
            "pkg/__init__.py": "",
            "pkg/kern.py": KERN,
            "pkg/util.py": "X = 1\n",
            "data/a.txt": "a",
            "data/b.txt": "b",
        },
    )
    m = load_manifest(str(root))
    first, second = m.tasks[:4], m.tasks[4:]
    assert len(first) == 4 and len(second) == 2
    assert all(t.kind == "python" and t.line == 4 for t in first)
    assert [t.spec["kwargs"] for t in first] == [
        {"value": v, "block": b, "label": f"v={v}", "nested": {"xs": [b, 1]}}
        for v in ("1.0f", "2.0f")
        for b in (128, 256)
    ]  # "{B}" alone keeps the grid value's type (128, an int); in text it is expanded
    assert all(t.spec["arch"] is None for t in first)
    assert first[0].label == "pkg.kern:build  V=1.0f B=128"
    # the files that travel, by content: the module, its package's __init__, the extras
    assert set(first[0].files) == {
        "pkg/kern.py",
        "pkg/__init__.py",
        "pkg/util.py",
        "data/a.txt",
        "data/b.txt",
    }
    assert all(len(sha) == 64 for sha in first[0].files.values())
    # an entry's own arch: one variant per arch, passed as the arch keyword argument
    assert [t.spec["arch"] for t in second] == ["sm_80", "sm_90"]
    assert [t.label for t in second] == ["kern:build  sm_80", "kern:build  sm_90"]
    assert set(second[0].files) == {"kern.py"}


BAD = [
    (
        '[[python]]\ncall = "kern:build"\ncal = "x"\n',
        3,
        "unknown key 'cal' in [[python]]; accepted keys: call, kwargs, files, arch, grid",
    ),
    ('[[python]]\nkwargs = { value = "1" }\n', 1, "this [[python]] has no call"),
    ('[[python]]\ncall = "kern.build"\n', 2, 'call must be "module:function"'),
    ('[[python]]\ncall = "kern:build()"\n', 2, 'call must be "module:function"'),
    ("[[python]]\ncall = 3\n", 2, "not an integer"),
    ('[[python]]\ncall = "nope:build"\n', 2, "no module nope under"),
    ('[[python]]\ncall = "kern:build"\nfiles = ["missing/*.py"]\n', 3, "names no file"),
    ('[[python]]\ncall = "kern:build"\nfiles = ["../x.py"]\n', 3, "may not travel"),
    (
        '[[python]]\ncall = "kern:build"\narch = "sm_90"\nkwargs = { arch = "sm_80" }\n',
        4,
        "kwargs.arch and arch are both given",
    ),
    (
        '[[python]]\ncall = "kern:build"\nkwargs = { when = 1979-05-27 }\n',
        3,
        "kwargs.when is",
    ),
    (
        '[[python]]\ncall = "kern:build"\nkwargs = { v = "{V}{W}" }\n[python.grid]\nW = [1]\n',
        3,
        "unknown placeholder {V}",
    ),
    (
        '[[python]]\ncall = "kern:build"\n[python.grid]\nW = [1, 2]\n',
        4,
        "grid variable W is used by no placeholder",
    ),
    ('[[python]]\ncall = "kern:build"\nkwargs = "x"\n', 3, "kwargs must be a table"),
]


@pytest.mark.parametrize(("text", "line", "words"), BAD)
def test_bad_python_entries_name_the_line(tmp_path, text, line, words):
    root = make_project(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        load_manifest(str(root))
    assert info.value.line == line, str(info.value)
    assert words in str(info.value)
    assert str(info.value).startswith(f"{root / 'cuforge.toml'}:{line}: ")


# -- running a variant --------------------------------------------------------------------


def test_each_run_imports_the_module_of_its_own_root_and_drops_it_after(tmp_path):
    roots = []
    for mark in ("a", "b"):
        root = tmp_path / mark
        root.mkdir()
        (root / "marked.py").write_text(
            f"MARK = {mark!r}\n\ndef check(expect):\n    assert MARK == expect, MARK\n"
        )
        (root / "cuforge.toml").write_text(
            f'[[python]]\ncall = "marked:check"\nkwargs = {{ expect = "{mark}" }}\n'
        )
        roots.append(root)
    here = os.getcwd()
    for root in roots:
        (task,) = load_manifest(str(root)).tasks
        result = run_task(task, str(root))
        assert result.ok, result.log
        assert result.hit  # it built nothing
        assert "marked" not in sys.modules and str(root) not in sys.path
    assert os.getcwd() == here
    # the wrong expectation: a failure whose log is the traceback from the call down
    (task,) = load_manifest(str(roots[0])).tasks
    task.spec["kwargs"]["expect"] = "b"
    result = run_task(task, str(roots[0]))
    assert not result.ok and not result.hit
    assert "marked:check(**{'expect': 'b'}) raised:" in result.log
    assert "AssertionError: a" in result.log and "marked.py" in result.log
    assert "_python_call" not in result.log  # cuforge's own frame is left out


GRID = """\
[[python]]
call = "kern:build"
arch = "sm_90"
kwargs = { value = "{V}" }
[python.grid]
V = [%s]
"""


def test_build_then_fresh_process_hits_failures_keep_their_traceback_and_strict(tmp_path):
    root = make_project(tmp_path, GRID % '"1.0f", "bad", "2.0f"')
    done = cli(root, "build", "--jobs", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ValueError: no kernel for value bad" in done.stderr
    assert "kern.py" in done.stderr and "Traceback" in done.stderr

    report = doc(cli(root, "build", "--jobs", "2", "--json"))
    assert report["failed"] == 1 and report["total"] == 3
    # the others were built by the first run: calling them again builds nothing
    assert report["hits"] == 2 and report["built"] == 0

    out = python_in(root, JIT)
    assert out == {"sources": ["disk", "disk"], "compiles": 0}

    (root / "cuforge.toml").write_text(GRID % '"1.0f", "2.0f"')
    assert cli(root, "build", "--strict").returncode == 0
    fresh = str(tmp_path / "fresh-cache")
    done = cli(root, "build", "--strict", "--json", CUFORGE_CACHE_DIR=fresh)
    assert done.returncode == 1
    report = doc(done)
    assert report["failed"] == 2 and report["built"] == 0
    log = report["results"][0]["log"]
    assert "strict mode: kern:build  V=1.0f  sm_90 ([[python]] at" in log
    assert "OfflineMissError" in log and "k.cu" in log


def test_a_bundle_carries_what_python_variants_built(tmp_path):
    root = make_project(tmp_path, GRID % '"1.0f", "2.0f"')
    bundle = str(tmp_path / "app.cfb")
    done = cli(root, "build", "--jobs", "2", "--bundle", bundle)
    assert done.returncode == 0, done.stderr
    fresh = str(tmp_path / "other-cache")
    out = python_in(
        root,
        f"import cuforge\ncuforge.load_bundle({bundle!r})\n" + JIT,
        CUFORGE_CACHE_DIR=fresh,
        CUFORGE_OFFLINE="1",
    )
    assert out == {"sources": ["bundle", "bundle"], "compiles": 0}


def test_ray_executor_ships_the_module_files_and_brings_the_entries_back(tmp_path):
    """Each Ray worker builds from its own copy of the files (the module, its package's
    __init__, the helper named in ``files``), in a private cache; the entries come back."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'cuforge[ray]')")
    root = make_project(
        tmp_path,
        (GRID % '"1.0f", "2.0f", "bad"').replace(
            'call = "kern:build"', 'call = "pkg.kern:build"\nfiles = ["pkg/util.py"]'
        ),
        {
            "pkg/__init__.py": "",
            "pkg/kern.py": KERN.replace("import cuforge", "import cuforge\nfrom pkg import util"),
            "pkg/util.py": "X = 1\n",
        },
    )
    done = cli(root, "build", "--executor", "ray", "--json", RAY_ADDRESS="")
    assert done.returncode == 1, done.stdout + done.stderr
    report = doc(done)
    assert report["executor"] == "ray" and report["built"] == 2 and report["failed"] == 1
    (failed,) = [r for r in report["results"] if not r["ok"]]
    assert "ValueError: no kernel for value bad" in failed["log"] and "on Ray node" in failed["log"]
    assert python_in(root, JIT) == {"sources": ["disk", "disk"], "compiles": 0}


# -- cuda.compute, for real ---------------------------------------------------------------

CCCL_KERNELS = """\
import numpy as np


def build_reduce(dtype):
    import cuda.compute as cc

    import cuforge.cccl as cccl

    dt = np.dtype(dtype)
    cccl.make_reduce_into(
        d_in=cc.ProxyArray(dt),
        d_out=cc.ProxyArray(dt),
        op=cc.OpKind.PLUS,
        h_init=np.zeros(1, dt),
        compute_capability=90,
    )
"""

CCCL_MANIFEST = """\
[[python]]
call = "kernels:build_reduce"
kwargs = { dtype = "{T}" }
[python.grid]
T = ["int32", "float64"]
"""

#: a fresh process making the same cuforge.cccl calls, written out here (not through the
#: project's module): where each came from, and the builds it made
CCCL_CALLS = """
import json, os
import numpy as np
import cuda.compute as cc
import cuforge
import cuforge.cccl as cccl
from cuforge.core import blobcache
if os.environ.get("BUNDLE"):
    cuforge.load_bundle(os.environ["BUNDLE"])
sources = []
for name in ("int32", "float64"):
    dt = np.dtype(name)
    cccl.make_reduce_into(d_in=cc.ProxyArray(dt), d_out=cc.ProxyArray(dt),
                          op=cc.OpKind.PLUS, h_init=np.zeros(1, dt), compute_capability=90)
    sources.append(cccl.last_result().source_of_result)
builds = sum(n for k, n in blobcache.counters.items() if k.endswith((":compiled", ":uncached")))
print(json.dumps({"sources": sources, "builds": builds}))
"""


@pytest.fixture(scope="module")
def cccl_env(tmp_path_factory) -> dict[str, str]:
    """What a child needs to import cuda.compute here (a stub libcuda without a driver)."""
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.compute") is None:
        pytest.skip("cuda-cccl (cuda.compute) is not installed: pip install 'cuforge[cccl]'")
    from tests.libcuda_stub import child_env_or_skip

    return child_env_or_skip(tmp_path_factory)


def test_cccl_variants_build_hit_bundle_and_serve_offline(tmp_path, cccl_env):
    root = make_project(tmp_path, CCCL_MANIFEST, {"kernels.py": CCCL_KERNELS})
    done = cli(root, "build", "--jobs", "2", "--json", **cccl_env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = doc(done)
    assert report["built"] == 2 and report["hits"] == 0 and report["failed"] == 0

    # a fresh process making the same calls: disk hits, no build
    out = python_in(tmp_path, CCCL_CALLS, **cccl_env)
    assert out == {"sources": ["disk", "disk"], "builds": 0}, out
    # the manifest again: both variants are hits (their calls build nothing)
    again = doc(cli(root, "build", "--jobs", "2", "--json", **cccl_env))
    assert again["hits"] == 2 and again["built"] == 0
    assert cli(root, "build", "--strict", **cccl_env).returncode == 0

    # a bundle (each variant built in a private cache: its entries come back to the driver)
    bundle = str(tmp_path / "app.cfb")
    done = cli(root, "build", "--jobs", "2", "--bundle", bundle, "--json", **cccl_env)
    assert done.returncode == 0, done.stderr
    assert doc(done)["bundle_entries"] == 2
    listing = cli(root, "bundle", "ls", bundle, "--verify", "--json")
    assert listing.returncode == 0, listing.stderr
    assert [e["kind"] for e in json.loads(listing.stdout)["entries"]] == ["cccl", "cccl"]

    # installed into a fresh cache dir: disk hits, in offline mode
    installed = str(tmp_path / "installed")
    assert cli(root, "bundle", "install", bundle, CUFORGE_CACHE_DIR=installed).returncode == 0
    out = python_in(
        tmp_path, CCCL_CALLS, CUFORGE_CACHE_DIR=installed, CUFORGE_OFFLINE="1", **cccl_env
    )
    assert out == {"sources": ["disk", "disk"], "builds": 0}, out

    # loaded at run time, nothing copied: served from the bundle, in offline mode
    empty = str(tmp_path / "empty")
    out = python_in(
        tmp_path,
        CCCL_CALLS,
        CUFORGE_CACHE_DIR=empty,
        CUFORGE_OFFLINE="1",
        BUNDLE=bundle,
        **cccl_env,
    )
    assert out == {"sources": ["bundle", "bundle"], "builds": 0}, out
    # and --strict checks the [[python]] variants against the cache dir
    done = cli(root, "build", "--strict", CUFORGE_CACHE_DIR=empty, **cccl_env)
    assert done.returncode == 1 and "OfflineMissError" in done.stderr  # the one offline error


# -- the CuTe DSL, for real ---------------------------------------------------------------

CUTE_KERNELS = """\
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor

BLOCK = 128


@cute.kernel
def double_kernel(a: cute.Tensor, b: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * BLOCK + tidx
    b[i] = a[i] + a[i]


@cute.jit
def double(a: cute.Tensor, b: cute.Tensor):
    double_kernel(a, b).launch(grid=(a.shape[0] // BLOCK, 1, 1), block=(BLOCK, 1, 1))


def fake(dtype):
    n = cute.sym_int32(divisibility=BLOCK)
    dt = getattr(cutlass, dtype)
    return make_fake_compact_tensor(dt, (n,)), make_fake_compact_tensor(dt, (n,))


def build(dtype):
    import cuforge.cute

    cuforge.cute.compile(double, *fake(dtype))
"""

#: a fresh process (in the project dir) compiling the same functions for the same specs
CUTE_CALLS = """
import json, os
import cuforge
import cuforge.cute as cc
from cuforge.core import blobcache
import ckern
if os.environ.get("BUNDLE"):
    cuforge.load_bundle(os.environ["BUNDLE"])
sources = [cc.compile_cached(ckern.double, *ckern.fake(t)).source_of_result
           for t in ("Float32", "Float16")]
builds = sum(n for k, n in blobcache.counters.items() if k.endswith((":compiled", ":uncached")))
print(json.dumps({"sources": sources, "builds": builds}))
"""


def test_cute_variants_build_hit_and_serve_from_a_bundle_offline(tmp_path):
    if importlib.util.find_spec("cutlass") is None:
        pytest.skip("the CuTe DSL is not installed (pip install 'cuforge[cute]')")
    from tests.conftest import GPU_VISIBLE

    # the DSL reads its arch once, at import: every child gets it (no GPU here)
    env = {} if GPU_VISIBLE else {"CUTE_DSL_ARCH": "sm_90a"}
    manifest = (GRID % '"Float32", "Float16"').replace('arch = "sm_90"\n', "")
    manifest = manifest.replace("kern:build", "ckern:build").replace("value = ", "dtype = ")
    root = make_project(tmp_path, manifest, {"ckern.py": CUTE_KERNELS})
    bundle = str(tmp_path / "cute.cfb")
    done = cli(root, "build", "--jobs", "2", "--bundle", bundle, "--json", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = doc(done)
    assert report["built"] == 2 and report["bundle_entries"] == 2

    assert python_in(root, CUTE_CALLS, **env) == {"sources": ["disk", "disk"], "builds": 0}
    out = python_in(
        root,
        CUTE_CALLS,
        CUFORGE_CACHE_DIR=str(tmp_path / "empty"),
        CUFORGE_OFFLINE="1",
        BUNDLE=bundle,
        **env,
    )
    assert out == {"sources": ["bundle", "bundle"], "builds": 0}
