"""A warm set shipped as a wheel: `cuforge bundle wheel` writes it, pip installs it into a
fresh venv, and a fresh cache dir there replays the recorded workload under
fence("error") with 0 compiles; a wheel for another cuforge version is skipped, with one
line in `cuforge doctor`."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import sysconfig
import zipfile

from tests.child import SRC
from tests.core.test_record import WORKLOAD, _cli, _run

REPLAY = WORKLOAD.replace(
    'if len(sys.argv) > 1 and sys.argv[1] == "replay":\n    cuforge.load_bundle("warm.cfb")\n',
    'if len(sys.argv) > 1 and sys.argv[1] == "replay":\n',
)


def _venv(tmp_path) -> tuple[str, dict[str, str]]:
    """A fresh venv (its python) and the environment its children get: this tree's src
    and the test interpreter's packages, so only the wheel is new in it."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
        timeout=120,
    )
    env = dict(os.environ)
    purelib = sysconfig.get_paths()["purelib"]
    env["PYTHONPATH"] = os.pathsep.join([SRC, purelib])
    # the toolkit's wheels (NVRTC) are found by site dir, which the venv does not share
    libs = sorted(glob.glob(os.path.join(purelib, "nvidia", "*", "lib")))
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")])
    env["CUFORGE_ARCH"] = "sm_90"
    return str(venv / "bin" / "python"), env


def _pip_install(python: str, wheel: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index"]
        + ["--disable-pip-version-check", "-q", wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _in_venv(python: str, env: dict[str, str], cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, *args], env=env, cwd=str(cwd), capture_output=True, text=True, timeout=300
    )


def test_wheel_replays_with_zero_compiles_in_a_fresh_venv(tmp_path, isolated_cache):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* x) { x[0] = TILE; }\n')
    first = _run(tmp_path, tmp_path / "c1", CUFORGE_RECORD="cuforge.lock")
    assert first["compiles"] == 3
    built = _cli(tmp_path, tmp_path / "c1", "build", "--lock", "cuforge.lock", "--bundle", "w.cfb")
    assert built.returncode == 0, built.stderr
    made = _cli(
        tmp_path, tmp_path / "c1", "bundle", "wheel", "w.cfb", "--name", "mymodel-kernels",
        "--version", "1.0", "--out", "dist", "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    wheel = json.loads(made.stdout)["wheel"]
    assert os.path.basename(wheel) == "mymodel_kernels-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = json.loads(z.read("mymodel_kernels/cuforge-bundle.json"))
        metadata = z.read("mymodel_kernels-1.0.dist-info/METADATA").decode()
    assert "mymodel_kernels/bundle.cfb" in names
    assert "[cuforge.bundles]" in z_text(wheel, "mymodel_kernels-1.0.dist-info/entry_points.txt")
    assert info["archs"] == ["sm_90"] or info["archs"] == []
    assert f"cuforge {info['cuforge_version']}" in metadata

    python, env = _venv(tmp_path)
    _pip_install(python, wheel)
    script = tmp_path / "replay.py"
    script.write_text(REPLAY)
    # a hit never looks for wheels; the first miss loads this one; the fence trips nothing
    env["CUFORGE_CACHE_DIR"] = str(tmp_path / "fresh")
    replay = _in_venv(python, env, tmp_path, str(script), "replay")
    assert replay.returncode == 0, replay.stderr
    result = json.loads(replay.stdout.strip().splitlines()[-1])
    assert result["compiles"] == 0
    assert result["binaries"] == first["binaries"] and result["keys"] == first["keys"]

    # the doctor sees it, usable
    doctor = _in_venv(python, env, tmp_path, "-m", "cuforge", "doctor", "--json")
    rows = {r["id"]: r for r in json.loads(doctor.stdout)["checks"]}
    assert rows["bundle_wheels"]["status"] == "PASS", rows["bundle_wheels"]
    assert "mymodel-kernels" in rows["bundle_wheels"]["detail"]


def z_text(wheel: str, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        return z.read(name).decode()


def test_a_mismatching_wheel_is_skipped_with_one_doctor_line(tmp_path, isolated_cache):
    from cuforge.aot.bundle import write_bundle
    from cuforge.aot.wheel import build_wheel

    bundle = tmp_path / "old.cfb"
    write_bundle(bundle, [], archs=["sm_90"])
    wheel = build_wheel(bundle, name="old-kernels", version="0.1", out_dir=tmp_path / "dist")
    # rewrite its description as made by another cuforge
    patched = tmp_path / "dist" / "patched"
    patched.mkdir()
    with zipfile.ZipFile(wheel) as z:
        z.extractall(patched)
    info_path = patched / "old_kernels" / "cuforge-bundle.json"
    info = json.loads(info_path.read_text())
    info["cuforge_version"] = "0.0.1"
    info_path.write_text(json.dumps(info))
    python, env = _venv(tmp_path)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    _pip_install(python, wheel)
    os.replace(info_path, os.path.join(site, "old_kernels", "cuforge-bundle.json"))
    env["CUFORGE_CACHE_DIR"] = str(tmp_path / "fresh")
    doctor = _in_venv(python, env, tmp_path, "-m", "cuforge", "doctor", "--json")
    rows = {r["id"]: r for r in json.loads(doctor.stdout)["checks"]}
    row = rows["bundle_wheels"]
    assert row["status"] == "WARN"
    assert "old-kernels: built for cuforge 0.0.1" in row["detail"]
    # and a miss compiles as usual (the wheel is skipped, not an error)
    code = (
        "import json, cuforge; "
        "cuforge.compile('extern \"C\" __global__ void v(int* p) { *p = 3; }', name='v.cu', "
        "arch='sm_90'); print(json.dumps(cuforge.default_cache().counters['compiles']))"
    )
    ran = _in_venv(python, env, tmp_path, "-c", code)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().splitlines()[-1] == "1"


def test_entry_points_scan_agrees_with_importlib_metadata(tmp_path, monkeypatch):
    """The direct scan of dist-info dirs finds what importlib.metadata finds: the group's
    lines only, the first distribution of a (normalized) name on the path wins, egg-info
    too; and it agrees on the real environment for groups that exist."""
    from importlib.metadata import entry_points as reference

    from cuforge.core import bundle_wheels

    def dist(where, meta, text):
        d = where / meta
        d.mkdir(parents=True)
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta.split('-')[0]}\n")
        (d / "entry_points.txt").write_text(text)

    first, second = tmp_path / "a", tmp_path / "b"
    group = f"[{bundle_wheels.GROUP}]"
    dist(
        first,
        "my_kernels-1.0.dist-info",
        f"[console_scripts]\nx = y:z\n\n{group}\nk = my_kernels\n",
    )
    dist(second, "My.Kernels-2.0.dist-info", f"{group}\nk2 = other\n")  # same name: shadowed
    dist(second, "old_kernels-0.1.egg-info", f"{group}\n# note\nold = old_kernels:x\n")
    dist(second, "nothing-1.0.dist-info", "[console_scripts]\ncuforge.bundles = no\n")
    path = [str(first), str(second)]
    monkeypatch.setattr(sys, "path", path)
    expected = sorted((e.name, e.value) for e in reference(group=bundle_wheels.GROUP))
    assert expected == [("k", "my_kernels"), ("old", "old_kernels:x")]
    assert sorted(bundle_wheels.entry_points()) == expected
    monkeypatch.undo()
    for name in ("console_scripts", "pytest11", bundle_wheels.GROUP):
        real = sorted((e.name, e.value) for e in reference(group=name))
        monkeypatch.setattr(bundle_wheels, "GROUP", name)
        assert sorted(bundle_wheels.entry_points()) == real, name


def test_a_dotted_entry_point_is_served_without_importing_its_package(tmp_path, isolated_cache):
    """The first miss finds the bundle of entry point ``k = a.b`` by walking sys.path for
    ``a/b/``: neither ``a/__init__.py`` nor ``a/b/__init__.py`` runs (find_spec("a.b")
    imported ``a``: any ``a`` on sys.path, the cwd's included, ran its code)."""
    import cuforge
    from cuforge.aot.bundle import write_bundle
    from cuforge.aot.wheel import build_wheel
    from cuforge.core.caching import Cache
    from cuforge.core.pipeline import call_entries
    from tests.child import child_env

    kernel = 'extern "C" __global__ void dotted(int* p) { *p = 35; }'
    builder = Cache(tmp_path / "builder")
    cuforge.compile(kernel, name="d.cu", arch="sm_90", cache=builder)
    bundle = tmp_path / "d.cfb"
    write_bundle(bundle, call_entries(kernel, name="d.cu", arch="sm_90", cache=builder))
    wheel = build_wheel(bundle, name="dotted-kernels", version="1.0", out_dir=tmp_path / "dist")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    marker = tmp_path / "imported"
    (site / "a" / "b").mkdir(parents=True)
    for f in os.listdir(site / "dotted_kernels"):
        os.replace(site / "dotted_kernels" / f, site / "a" / "b" / f)
    plant = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (site / "a" / "__init__.py").write_text(plant)
    (site / "a" / "b" / "__init__.py").write_text(plant)
    points = site / "dotted_kernels-1.0.dist-info" / "entry_points.txt"
    points.write_text("[cuforge.bundles]\nk = a.b\n")
    code = (
        "import json, cuforge; "
        f"r = cuforge.compile({kernel!r}, name='d.cu', arch='sm_90'); "
        "print(json.dumps([r.source_of_result, cuforge.default_cache().counters['compiles']]))"
    )
    env = child_env(CUFORGE_CACHE_DIR=str(tmp_path / "fresh"))
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(site)])
    ran = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=str(tmp_path), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == ["bundle", 0]
    assert not marker.exists(), marker.read_text()


def test_package_dirs_follows_the_path_finder_without_importing(tmp_path):
    from cuforge.core.bundle_wheels import package_dirs

    one, two, three = tmp_path / "1", tmp_path / "2", tmp_path / "3"
    (one / "ns" / "pkg").mkdir(parents=True)  # ns: a namespace package over 1 and 2
    (two / "ns" / "pkg").mkdir(parents=True)
    (two / "ns" / "pkg" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (three / "reg").mkdir(parents=True)
    (two / "reg.py").write_text("")  # a module of that name first: not a package
    (three / "reg" / "__init__.py").write_text("")
    path = [str(one), str(two), str(three)]
    # ns.pkg: 1/ns/pkg has no __init__, 2/ns/pkg does: the regular package wins
    assert package_dirs("ns.pkg", path) == [str(two / "ns" / "pkg")]
    assert package_dirs("ns", path) == [str(one / "ns"), str(two / "ns")]
    assert package_dirs("reg", path) == []
    assert package_dirs("missing.x", path) == []
