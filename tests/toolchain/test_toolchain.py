"""Toolchain discovery, the compiler identity and its on-disk memo, and arch resolution.

Real toolchain, no mocks: fake toolkits and fake nvcc scripts are real files in tmp dirs."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from cuforge import toolchain
from cuforge.base.arch import arch_number
from cuforge.base.errors import ArchError, ToolchainError
from tests.conftest import child_env, run_python

REAL_ROOT = toolchain.toolkit_root()
needs_toolkit = pytest.mark.skipif(
    REAL_ROOT is None or not os.path.isfile(os.path.join(REAL_ROOT or "", "bin", "nvcc")),
    reason="no CUDA toolkit with bin/nvcc",
)


def _clean_toolkit_env(monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)


def _write_exe(path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


# -- finding the toolkit --------------------------------------------------------------


@needs_toolkit
def test_toolkit_root_follows_a_shell_script_wrapper_on_path(tmp_path, monkeypatch):
    _clean_toolkit_env(monkeypatch)
    bindir = tmp_path / "wrapper-bin"
    bindir.mkdir()
    real_nvcc = os.path.join(REAL_ROOT, "bin", "nvcc")
    _write_exe(bindir / "nvcc", f'#!/bin/sh\nexec {real_nvcc} "$@"\n')
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert toolchain.toolkit_root() == os.path.realpath(REAL_ROOT)


@needs_toolkit
def test_toolkit_root_follows_a_symlink_on_path(tmp_path, monkeypatch):
    _clean_toolkit_env(monkeypatch)
    bindir = tmp_path / "link-bin"
    bindir.mkdir()
    os.symlink(os.path.join(REAL_ROOT, "bin", "nvcc"), bindir / "nvcc")
    monkeypatch.setenv("PATH", str(bindir))
    assert toolchain.toolkit_root() == os.path.realpath(REAL_ROOT)


def test_cuda_home_overrides_and_an_invalid_one_is_ignored(tmp_path, monkeypatch):
    fake = tmp_path / "fake-cuda"
    (fake / "include").mkdir(parents=True)
    (fake / "include" / "cuda_runtime.h").write_text("// fake\n")
    monkeypatch.setenv("CUDA_HOME", str(fake))
    assert toolchain.toolkit_root() == os.path.realpath(fake)
    # CUDA_PATH is read too
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.setenv("CUDA_PATH", str(fake))
    assert toolchain.toolkit_root() == os.path.realpath(fake)
    # a symlink to a toolkit resolves to the real directory
    link = tmp_path / "cuda-link"
    os.symlink(fake, link)
    monkeypatch.setenv("CUDA_PATH", str(link))
    assert toolchain.toolkit_root() == os.path.realpath(fake)
    # a CUDA_HOME that is no toolkit is skipped, not trusted
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_PATH")
    root = toolchain.toolkit_root()
    assert root != str(tmp_path / "empty")
    assert root is None or os.path.isdir(os.path.join(root, "include"))


def test_no_toolkit_anywhere_gives_none_and_a_helpful_nvcc_error(tmp_path, monkeypatch):
    if os.path.exists("/usr/local/cuda"):
        pytest.skip("/usr/local/cuda exists: the fallback finds it")
    _clean_toolkit_env(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert toolchain.toolkit_root() is None
    with pytest.raises(ToolchainError, match="CUDA_HOME"):
        toolchain.nvcc_path()


@needs_toolkit
def test_nvcc_path_and_include_dirs():
    nvcc = toolchain.nvcc_path()
    assert os.path.isfile(nvcc) and os.access(nvcc, os.X_OK)
    dirs = toolchain.toolkit_include_dirs()
    assert any(os.path.isfile(os.path.join(d, "cuda_fp16.h")) for d in dirs)
    assert any(os.path.isdir(os.path.join(d, "cub")) for d in dirs)


def test_cuforge_nvcc_that_is_not_executable_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("CUFORGE_NVCC", str(tmp_path / "missing-nvcc"))
    with pytest.raises(ToolchainError, match="CUFORGE_NVCC"):
        toolchain.nvcc_path()


def test_nvrtc_library_is_found():
    path = toolchain.nvrtc_library_path()
    assert os.path.isfile(path) and "nvrtc" in os.path.basename(path)


# -- the compiler identity ------------------------------------------------------------

IDENTITY_CHILD = """
import json, sys
from cuforge.toolchain import compiler_identity
out = {"nvrtc": compiler_identity("nvrtc")}
try:
    out["nvcc"] = compiler_identity("nvcc")
except Exception as exc:
    out["nvcc"] = repr(exc)
out["cuda_modules"] = sorted(m for m in sys.modules if m == "cuda" or m.startswith("cuda."))
out["subprocess"] = "subprocess" in sys.modules
with open("/proc/self/maps") as f:
    out["nvrtc_loaded"] = "libnvrtc" in f.read()
print(json.dumps(out))
"""


def test_identity_in_a_warm_fresh_process_needs_no_bindings_nvrtc_or_nvcc(isolated_cache):
    env = child_env()
    cold = run_python(IDENTITY_CHILD, env)
    assert (isolated_cache / "toolchain.json").is_file()
    warm = run_python(IDENTITY_CHILD, env)
    assert warm["nvrtc"] == cold["nvrtc"]
    assert warm["nvcc"] == cold["nvcc"]
    assert warm["cuda_modules"] == []
    assert warm["nvrtc_loaded"] is False
    assert warm["subprocess"] is False  # nvcc --version was not run
    nvrtc = warm["nvrtc"]
    assert nvrtc["compiler"] == "nvrtc"
    assert re.fullmatch(r"\d+\.\d+", nvrtc["version"])
    assert re.fullmatch(r"[0-9a-f]{64}", nvrtc["library_sha256"])
    # no path in the key: the same release in another venv (or machine) keys the same
    assert nvrtc["library"].startswith("libnvrtc") and os.sep not in nvrtc["library"]
    assert not any(os.sep in value for value in nvrtc.values()), nvrtc
    assert re.search(r"cuda\.h=[0-9a-f]{16}", nvrtc["headers"])
    # the identity seen in this process is the same
    assert toolchain.compiler_identity("nvrtc") == nvrtc


FAKE_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "nvcc: NVIDIA (R) Cuda compiler driver"
  echo "Cuda compilation tools, release {major}, V{full}"
  exit 0
fi
exit 1
"""


def test_identity_follows_the_memo_stat_of_the_executable(tmp_path, monkeypatch, isolated_cache):
    fake = tmp_path / "bin" / "nvcc"
    fake.parent.mkdir()
    _write_exe(fake, FAKE_NVCC.format(major="12.9", full="12.9.41"))
    monkeypatch.setenv("CUFORGE_NVCC", str(fake))
    first = toolchain.compiler_identity("nvcc")
    assert first["path"] == "nvcc"  # its name, not its path: see the last step
    assert first["version"] == "12.9.41"
    assert "V12.9.41" in first["version_output"]
    memo = json.loads((isolated_cache / "toolchain.json").read_text())
    assert any(str(fake) in k for k in memo["probes"])

    # same stat: the memo answers, even for a different process (checked by the next step)
    assert toolchain.compiler_identity("nvcc") == first

    # a different executable behind the same path (new size and mtime): re-probed
    _write_exe(fake, FAKE_NVCC.format(major="12.8", full="12.8.93-custom"))
    st = os.stat(fake)
    os.utime(fake, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    second = toolchain.compiler_identity("nvcc")
    assert second["version"] == "12.8.93-custom"
    assert second != first

    # another copy of the same release elsewhere (another venv, another machine) is the
    # same compiler: the same identity, so a shared cache hits across them; it is probed
    # under its own path (the memo never answers for a file it has not seen)
    other = tmp_path / "other" / "nvcc"
    other.parent.mkdir()
    _write_exe(other, FAKE_NVCC.format(major="12.9", full="12.9.41"))
    monkeypatch.setenv("CUFORGE_NVCC", str(other))
    third = toolchain.compiler_identity("nvcc")
    assert third == first
    memo = json.loads((isolated_cache / "toolchain.json").read_text())
    assert any(str(other) in k for k in memo["probes"])


def test_a_broken_nvcc_is_a_toolchain_error(tmp_path, monkeypatch):
    fake = tmp_path / "nvcc"
    _write_exe(fake, "#!/bin/sh\necho broken >&2\nexit 3\n")
    monkeypatch.setenv("CUFORGE_NVCC", str(fake))
    with pytest.raises(ToolchainError, match="--version failed"):
        toolchain.compiler_identity("nvcc")
    assert toolchain.nvcc_version() is None


def test_unwritable_memo_dir_just_reprobes(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(blocker / "cache"))
    fake = tmp_path / "nvcc"
    _write_exe(fake, FAKE_NVCC.format(major="12.9", full="12.9.41"))
    monkeypatch.setenv("CUFORGE_NVCC", str(fake))
    assert toolchain.compiler_identity("nvcc")["version"] == "12.9.41"
    assert toolchain.compiler_identity("nvrtc")["compiler"] == "nvrtc"


def test_corrupt_memo_is_ignored_and_rewritten(isolated_cache):
    isolated_cache.mkdir(parents=True, exist_ok=True)
    (isolated_cache / "toolchain.json").write_text("{ not json")
    result = run_python(IDENTITY_CHILD)
    assert result["nvrtc"]["compiler"] == "nvrtc"
    json.loads((isolated_cache / "toolchain.json").read_text())


LOCATE_CHILD = """
import json, sys
from cuforge.toolchain import locate
path = locate.nvrtc_library_path()
# searched: derived in this process (replayed or by cuda-pathfinder), not read from the memo
print(json.dumps({"path": path, "searched": bool(locate._derived_memo or locate._found_memo)}))
"""


def test_remembered_nvrtc_location_is_revalidated(isolated_cache):
    env = child_env()
    first = run_python(LOCATE_CHILD, env)
    assert first["searched"] is True
    assert run_python(LOCATE_CHILD, env) == {"path": first["path"], "searched": False}
    memo_path = isolated_cache / "toolchain.json"
    memo = json.loads(memo_path.read_text())
    (entry,) = memo["locate"].values()
    # a wheel installed or removed since (site-packages changed): search again
    entry["site"] = [[p, m + 1] for p, m in entry["site"]] or [["/nowhere", 1]]
    memo_path.write_text(json.dumps(memo))
    assert run_python(LOCATE_CHILD, env) == {"path": first["path"], "searched": True}
    # the remembered library is gone: search again
    memo = json.loads(memo_path.read_text())
    (entry,) = memo["locate"].values()
    entry["path"] = str(isolated_cache / "gone" / "libnvrtc.so.13")
    memo_path.write_text(json.dumps(memo))
    assert run_python(LOCATE_CHILD, env) == {"path": first["path"], "searched": True}


REPLAY_CHILD = """
import json, sys
from cuforge.toolchain import compiler_identity, locate
identity = compiler_identity("nvrtc")
out = {"derived": locate.derive_nvrtc_library(), "identity": identity,
       "pathfinder": "cuda.pathfinder" in sys.modules}
out["found"] = locate.find_nvrtc_library()  # cuda-pathfinder's own search
print(json.dumps(out))
"""


def test_a_fresh_cache_dir_locates_nvrtc_as_cuda_pathfinder_does_without_importing_it(
    isolated_cache,
):
    out = run_python(REPLAY_CHILD, child_env())
    if not locate_is_a_wheel(out["found"]):
        pytest.skip("NVRTC is not a pip wheel here: cuda-pathfinder searches for it")
    # the replayed search (a few stats) named the library cuda-pathfinder then found,
    # and the key was made without importing cuda-pathfinder (~45 ms)
    assert out["pathfinder"] is False
    assert out["derived"] == out["found"]
    assert out["identity"] == toolchain.compiler_identity("nvrtc")


def locate_is_a_wheel(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}nvidia{os.sep}" in path


def _keyed_with(library: str) -> None:
    """Make this process key with ``library`` (as a stale or wrong replay would)."""
    from cuforge.toolchain import identity, locate

    locate._nvrtc_path_memo[locate._nvrtc_locate_key()] = library
    identity._identity_memo.clear()


def test_compiling_with_another_nvrtc_than_the_keyed_one_is_refused_once(isolated_cache, tmp_path):
    from cuforge.toolchain import locate

    found = locate.find_nvrtc_library()
    alt = os.path.join(os.path.dirname(found), os.path.basename(found).replace(".so", ".alt.so"))
    if not os.path.isfile(alt):
        pytest.skip("no second build of NVRTC (the wheel's .alt.so) to key with")
    other = tmp_path / "elsewhere" / os.path.basename(found)
    other.parent.mkdir()
    other.write_bytes(open(alt, "rb").read())  # same release, other content
    _keyed_with(str(other))
    with pytest.raises(ToolchainError, match="cuda-bindings loaded"):
        toolchain.check_loaded_nvrtc()
    # repaired: the next try keys with the loaded library, and the check passes
    assert toolchain.nvrtc_library_path() == found
    toolchain.check_loaded_nvrtc()


def test_a_copy_of_the_loaded_nvrtc_keys_the_same_and_passes_the_check(isolated_cache, tmp_path):
    from cuforge.toolchain import locate

    found = locate.find_nvrtc_library()
    before = toolchain.compiler_identity("nvrtc")
    copy = tmp_path / "copy" / os.path.basename(found)
    copy.parent.mkdir()
    copy.write_bytes(open(found, "rb").read())
    _keyed_with(str(copy))
    toolchain.check_loaded_nvrtc()  # same content: the keys stand
    assert toolchain.nvrtc_library_path() == found
    assert toolchain.compiler_identity("nvrtc") == before


def test_unknown_backend():
    with pytest.raises(ValueError, match="nvrtc"):
        toolchain.compiler_identity("clang")


def test_doctor_helpers():
    assert re.fullmatch(r"\d+\.\d+", toolchain.nvrtc_version() or "")
    nvrtc_archs = toolchain.supported_archs("nvrtc")
    assert "sm_90" in nvrtc_archs
    if REAL_ROOT is not None and os.path.isfile(os.path.join(REAL_ROOT, "bin", "nvcc")):
        assert re.fullmatch(r"\d+\.\d+(\.\d+)?", toolchain.nvcc_version() or "")
        assert "sm_90" in toolchain.supported_archs("nvcc")


# -- the driver and archs -------------------------------------------------------------


def test_visible_gpu_archs_and_driver_version_never_raise():
    archs = toolchain.visible_gpu_archs()
    assert isinstance(archs, list)
    assert all(re.fullmatch(r"sm_\d{2,3}", a) for a in archs)
    assert toolchain.visible_gpu_archs() == archs
    version = toolchain.driver_version()
    assert version is None or version >= 1000
    if archs:
        assert version is not None


GPU_CHILD = """
import json, time
from cuforge.toolchain import visible_gpu_archs
start = time.perf_counter()
archs = visible_gpu_archs()
seconds = time.perf_counter() - start
with open("/proc/self/maps") as f:
    loaded = "libcuda" in f.read()
print(json.dumps({"archs": archs, "libcuda_loaded": loaded, "seconds": seconds}))
"""


@pytest.mark.gpu
def test_visible_archs_are_remembered_across_processes_without_cuinit(isolated_cache):
    env = child_env()
    first = run_python(GPU_CHILD, env)
    assert first["archs"] and first["archs"] == toolchain.visible_gpu_archs()
    if not os.path.isdir("/proc/driver/nvidia/gpus"):
        pytest.skip("the driver exposes no /proc/driver/nvidia/gpus to key the memo on")
    second = run_python(GPU_CHILD, env)
    assert second["archs"] == first["archs"]
    assert second["libcuda_loaded"] is False  # no cuInit: the on-disk memo answered
    # a different CUDA_VISIBLE_DEVICES is a different key: the driver is asked again
    third = run_python(GPU_CHILD, child_env(CUDA_VISIBLE_DEVICES="0"))
    assert third["libcuda_loaded"] is True
    assert third["archs"] == first["archs"][:1]


@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("sm_90", ("sm_90",)),
        ("9.0", ("sm_90",)),
        ("90", ("sm_90",)),
        (90, ("sm_90",)),
        ("sm_90a", ("sm_90a",)),
        ("compute_80", ("compute_80",)),
        (["8.0", "sm_90", 90], ("sm_80", "sm_90")),
        ("8.0;9.0", ("sm_80", "sm_90")),
    ],
)
def test_explicit_arch_spellings(spelling, expected):
    assert toolchain.resolve_archs(spelling, allow_many=True) == expected


def test_explicit_arch_wins_over_environment(monkeypatch):
    monkeypatch.setenv("CUFORGE_ARCH", "sm_80")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5")
    assert toolchain.resolve_archs("sm_90", allow_many=False) == ("sm_90",)


def test_several_explicit_archs_for_one_arch_compile_is_an_error():
    with pytest.raises(ArchError, match="fatbin"):
        toolchain.resolve_archs(["sm_80", "sm_90"], allow_many=False)


def test_bad_arch_strings():
    for bad in ("sm_9x", "banana", "", "9.0.1", 5):
        with pytest.raises(ArchError):
            toolchain.resolve_archs(bad, allow_many=False)


def test_environment_order(monkeypatch):
    gpus = toolchain.visible_gpu_archs()
    monkeypatch.setenv("CUFORGE_ARCH", "8.0;9.0")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5 8.6+PTX")
    if gpus:  # the visible GPU comes before both variables
        assert toolchain.resolve_archs(None, allow_many=False) == (gpus[0],)
        return
    # CUFORGE_ARCH first; the highest when one arch is needed
    assert toolchain.resolve_archs(None, allow_many=False) == ("sm_90",)
    assert toolchain.resolve_archs(None, allow_many=True) == ("sm_80", "sm_90")
    # then TORCH_CUDA_ARCH_LIST (+PTX dropped)
    monkeypatch.delenv("CUFORGE_ARCH")
    assert toolchain.resolve_archs(None, allow_many=False) == ("sm_86",)
    assert toolchain.resolve_archs(None, allow_many=True) == ("sm_75", "sm_86")
    # a bad value names the variable
    monkeypatch.setenv("CUFORGE_ARCH", "sm_nine")
    with pytest.raises(ArchError, match="CUFORGE_ARCH"):
        toolchain.resolve_archs(None, allow_many=False)


def test_no_arch_anywhere_says_exactly_how_to_set_it(monkeypatch):
    if toolchain.visible_gpu_archs():
        pytest.skip("a GPU is visible: its arch is used")
    monkeypatch.delenv("CUFORGE_ARCH", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    with pytest.raises(ArchError) as info:
        toolchain.resolve_archs(None, allow_many=False)
    message = str(info.value)
    assert "CUFORGE_ARCH=sm_90" in message
    assert "arch='sm_90'" in message
    assert "no GPU" in message


def test_arch_number_orders_archs():
    archs = ["sm_90a", "sm_100", "sm_80", "sm_90"]
    assert sorted(archs, key=arch_number) == ["sm_80", "sm_90", "sm_90a", "sm_100"]


# -- the wheel RECORD stands in for hashing an installed library --------------------------


def _fake_site(tmp_path, content: bytes, *, recorded: bytes | None = None):
    """A site-packages with one wheel-installed library; its RECORD line describes
    ``recorded`` (default: ``content``)."""
    import base64
    import hashlib

    site = tmp_path / "site-packages"
    lib = site / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.13").write_bytes(content)
    described = content if recorded is None else recorded
    digest = base64.urlsafe_b64encode(hashlib.sha256(described).digest()).rstrip(b"=").decode()
    info = site / "nvidia_cuda_nvrtc-13.0.88.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(
        f"nvidia/cu13/lib/libnvrtc.so.13,sha256={digest},{len(described)}\n"
        "nvidia_cuda_nvrtc-13.0.88.dist-info/RECORD,,\n"
    )
    (site / "other-1.0.dist-info").mkdir()  # a RECORD-less dist beside it
    return str(lib / "libnvrtc.so.13")


def test_record_sha256_is_the_content_digest_and_vouches_only_for_matching_contents(tmp_path):
    import hashlib

    from cuforge.toolchain import installed

    installed.reset()
    content = b"\x7fELF" + os.urandom(4096)
    path = _fake_site(tmp_path / "a", content)
    expected = hashlib.sha256(content).hexdigest()
    assert installed.recorded_sha256(path) == expected == installed.hash_file(path)
    # a symlink to it (as a library's soname link) resolves to the recorded file
    link = tmp_path / "libnvrtc.so"
    link.symlink_to(path)
    assert installed.recorded_sha256(str(link)) == expected
    # the same wheel in another venv: the same, path-free value
    other = _fake_site(tmp_path / "b", content)
    assert installed.recorded_sha256(other) == expected
    # a file of the recorded size whose contents differ (edited in place): RECORD does not
    # vouch for it, and it is keyed by what it holds
    installed.reset()
    same_size = bytes(len(content))
    planted = _fake_site(tmp_path / "c", content, recorded=same_size)
    assert installed.recorded_sha256(planted) is None
    assert installed.installed_sha256(planted) == expected


def test_record_is_not_trusted_for_a_changed_size_or_an_unlisted_file(tmp_path):
    import hashlib

    from cuforge.toolchain import installed

    installed.reset()
    content = b"\x7fELF" + os.urandom(1000)
    path = _fake_site(tmp_path, content, recorded=content + b"x")  # size differs
    assert installed.recorded_sha256(path) is None
    assert installed.installed_sha256(path) == hashlib.sha256(content).hexdigest()
    loose = tmp_path / "loose.so"
    loose.write_bytes(b"not from a wheel")
    assert installed.recorded_sha256(str(loose)) is None
    assert installed.installed_sha256(str(loose)) == hashlib.sha256(b"not from a wheel").hexdigest()


def test_nvrtc_identity_is_the_checked_wheel_digest_and_a_warm_process_hashes_nothing(
    isolated_cache,
):
    """The identity's library_sha256 is the installed NVRTC wheel's RECORD digest, checked
    against the file's contents once (a cold cache dir hashes the library once); a fresh
    process on the warm cache dir hashes nothing."""
    child = """
        import json
        from cuforge.toolchain import compiler_identity, installed
        from cuforge.toolchain import locate
        calls = []
        real = installed.hash_file
        installed.hash_file = lambda p: calls.append(p) or real(p)
        ident = compiler_identity("nvrtc")
        lib = locate.find_nvrtc_library()
        hashed = [p for p in calls if "nvrtc" in p]
        print(json.dumps({"sha": ident["library_sha256"], "recorded": installed.recorded_sha256(lib),
                          "hashed": hashed, "file": real(lib)}))
        """
    cold = run_python(child, env=child_env())
    if cold["recorded"] is None:
        pytest.skip("NVRTC here is not from a pip wheel")
    assert cold["sha"] == cold["recorded"] == cold["file"]
    assert len(cold["hashed"]) == 1
    warm = run_python(child, env=child_env())
    assert warm["sha"] == cold["sha"]
    assert warm["hashed"] == []


# -- the headers NVRTC compiles with ----------------------------------------------------


def _header_wheels(tmp_path, nvrtc: str, headers: int):
    """A site-packages holding the nvidia-cuda-nvrtc wheel ``nvrtc`` and CUDA header wheels
    whose cuda.h says ``headers`` (real files; nothing is loaded)."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    lib = site / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnvrtc.so.13").write_bytes(b"")
    (site / f"nvidia_cuda_nvrtc-{nvrtc}.dist-info").mkdir()
    inc = site / "nvidia" / "cu13" / "include"
    inc.mkdir()
    (inc / "cuda.h").write_text(f"#define CUDA_VERSION {headers}\n")
    return str(lib / "libnvrtc.so.13"), str(inc)


def _toolkit_with_headers(tmp_path, cuda_version: int) -> str:
    inc = tmp_path / "cuda" / "include"
    inc.mkdir(parents=True)
    (inc / "cuda_runtime.h").write_text("")
    (inc / "cuda.h").write_text(f"#define CUDA_VERSION {cuda_version}\n")
    return os.path.realpath(tmp_path / "cuda")


@pytest.mark.parametrize(
    ("nvrtc", "wheel_headers", "wins"),
    [
        ("13.5.12", 13050, "wheels"),  # NVRTC 13.5 takes its own release's header wheels
        ("13.5.12", 13020, "toolkit"),  # header wheels of a third release: no better
        ("13.0.88", 13050, "toolkit"),  # NVRTC of the toolkit's release: the toolkit's
    ],
)
def test_nvrtc_compiles_with_the_headers_of_its_own_release(
    tmp_path, monkeypatch, nvrtc, wheel_headers, wins
):
    from cuforge.toolchain import locate

    _clean_toolkit_env(monkeypatch)
    root = _toolkit_with_headers(tmp_path, 13000)
    library, wheel_inc = _header_wheels(tmp_path, nvrtc, wheel_headers)
    monkeypatch.setenv("CUDA_HOME", root)
    monkeypatch.setattr(locate, "nvrtc_library_path", lambda: library)
    monkeypatch.setattr(locate, "_pathfinder_include_dirs", lambda: (wheel_inc,))
    monkeypatch.setattr(locate, "_include_memo", {})
    assert locate.nvrtc_wheel_version(library) == tuple(map(int, nvrtc.split(".")[:2]))
    expected = [wheel_inc] if wins == "wheels" else [os.path.join(root, "include")]
    assert toolchain.toolkit_include_dirs() == expected


def test_nvrtc_wheel_version_is_none_outside_a_wheel(tmp_path):
    from cuforge.toolchain import locate

    (tmp_path / "lib64").mkdir()
    (tmp_path / "lib64" / "libnvrtc.so.13").write_bytes(b"")
    assert locate.nvrtc_wheel_version(str(tmp_path / "lib64" / "libnvrtc.so.13")) is None
    # the real one, where NVRTC comes from a wheel: the wheel's release is NVRTC's
    real = toolchain.nvrtc_library_path()
    found = locate.nvrtc_wheel_version(real)
    if found is not None:
        assert found == toolchain.nvrtc_version_tuple()


HEADERS_CHILD = """
import json, sys
from cuforge.toolchain import locate
print(json.dumps({"dirs": list(locate._pathfinder_include_dirs()),
                  "pathfinder": "cuda.pathfinder" in sys.modules}))
"""


def _include_entry(cache_dir) -> tuple[dict, dict]:
    memo = json.loads((cache_dir / "toolchain.json").read_text())
    (key,) = [k for k in memo.get("locate", {}) if k.startswith("include|")]
    return memo, memo["locate"][key]


def test_remembered_header_dirs_are_revalidated(isolated_cache):
    """cuda-pathfinder's header dirs are searched once per cache dir, not once per process,
    and searched again when a wheel comes or goes or a header they were found by changes."""
    env = child_env()
    first = run_python(HEADERS_CHILD, env)
    if not first["dirs"] or not all(f"{os.sep}site-packages{os.sep}" in d for d in first["dirs"]):
        pytest.skip("cuda-pathfinder finds no header wheels here")
    assert first["pathfinder"] is True
    assert run_python(HEADERS_CHILD, env) == {"dirs": first["dirs"], "pathfinder": False}
    memo_path = isolated_cache / "toolchain.json"
    # a wheel installed or removed since (a site-packages dir changed): search again
    memo, entry = _include_entry(isolated_cache)
    entry["site"] = [[p, m + 1] for p, m in entry["site"]]
    memo_path.write_text(json.dumps(memo))
    assert run_python(HEADERS_CHILD, env) == {"dirs": first["dirs"], "pathfinder": True}
    # a header a dir was found by changed (or is gone): search again
    memo, entry = _include_entry(isolated_cache)
    entry["checks"][0][1] = [entry["checks"][0][1][0] + 1, entry["checks"][0][1][1]]
    memo_path.write_text(json.dumps(memo))
    assert run_python(HEADERS_CHILD, env) == {"dirs": first["dirs"], "pathfinder": True}
    assert run_python(HEADERS_CHILD, env)["pathfinder"] is False  # remembered again
    # another CUDA_HOME is another search (pathfinder reads it)
    other = run_python(HEADERS_CHILD, child_env(CUDA_HOME=str(isolated_cache / "none")))
    assert other["pathfinder"] is True


def test_header_dirs_are_remembered_only_under_roots_the_memo_checks(tmp_path, monkeypatch):
    """A dir pathfinder found under a site-packages dir, CONDA_PREFIX, CUDA_HOME or
    CUDA_PATH is remembered with the stat of the header it was found by; one found
    elsewhere (a system install dir), or none, is searched again in each process."""
    from cuforge.toolchain import locate

    _clean_toolkit_env(monkeypatch)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    inc = tmp_path / "cuda" / "include"
    (inc / "cccl" / "cuda" / "std").mkdir(parents=True)
    (inc / "cuda_runtime.h").write_text("")
    (inc / "cccl" / "cuda" / "std" / "version").write_text("")
    dirs = (str(inc), str(inc / "cccl"))
    site = locate._site_signature()
    assert locate._pf_entry(dirs, site) is None  # under no checked root
    assert locate._pf_entry((), site) is None  # nothing found
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    entry = locate._pf_entry(dirs, site)
    assert entry is not None
    assert [c[0] for c in entry["checks"]] == [
        str(inc / "cuda_runtime.h"),
        str(inc / "cccl" / "cuda" / "std" / "version"),
    ]
    assert locate._remembered_pf_dirs(entry, site) == dirs
    (inc / "cuda_runtime.h").write_text("// changed\n")
    assert locate._remembered_pf_dirs(entry, site) is None
    # a check that is not the header of its dir is not taken
    entry = locate._pf_entry(dirs, site)
    entry["checks"][0][0] = str(tmp_path / "elsewhere.h")
    assert locate._remembered_pf_dirs(entry, site) is None


CHECK_HEADERS_CHILD = """
import json, sys
import cuforge
from cuforge.base.errors import ToolchainError
from cuforge.toolchain import locate
SRC = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 3.0f; }'
keyed = locate.toolkit_include_dirs()
try:
    cuforge.compile(SRC, arch="sm_90")
    error = None
except ToolchainError as exc:
    error = str(exc)
again = cuforge.compile(SRC, arch="sm_90").source_of_result
print(json.dumps({"keyed": keyed, "error": error, "again": again,
                  "now": locate.toolkit_include_dirs()}))
"""


def test_a_compile_checks_remembered_header_dirs_against_cuda_pathfinder(tmp_path, isolated_cache):
    """The header dirs a key took from the memo are the ones cuda-pathfinder finds before
    NVRTC compiles with them: when they are not, nothing is compiled, the error says so,
    and the memo then holds pathfinder's answer (the next try keys with it and compiles)."""
    from tests.mixed_toolkit import skip_unless_header_wheels_win, toolkit_of_another_release

    toolkit = toolkit_of_another_release(str(tmp_path))
    env = child_env(CUDA_HOME=toolkit)
    env.pop("CUDA_PATH", None)
    first = run_python(CHECK_HEADERS_CHILD, env)
    skip_unless_header_wheels_win(first["keyed"], toolkit)
    assert first["error"] is None and first["again"] == "memory"
    wheel = first["keyed"]
    # the memo now names a copy of the header wheel (same headers, another dir): a stale
    # or foreign answer that pathfinder would not give
    copy = tmp_path / "venv" / "lib" / "python3" / "site-packages" / "copy"
    copy.mkdir(parents=True)
    for name in os.listdir(wheel[0]):
        if name == "cuda.h":  # read as a regular file only (its CUDA_VERSION is the release)
            (copy / name).write_bytes(open(os.path.join(wheel[0], name), "rb").read())
        else:
            os.symlink(os.path.join(wheel[0], name), copy / name)
    memo, entry = _include_entry(isolated_cache)
    entry["dirs"] = [str(copy), str(copy / "cccl")][: len(entry["dirs"])]
    entry["checks"] = [
        [c[0].replace(d, n, 1), c[1]]
        for c, d, n in zip(entry["checks"], wheel, entry["dirs"], strict=True)
    ]
    (isolated_cache / "toolchain.json").write_text(json.dumps(memo))
    out = run_python(CHECK_HEADERS_CHILD.replace("3.0f", "4.0f"), env)  # a miss
    assert out["keyed"] == entry["dirs"]  # the key took the memo's answer...
    assert out["error"] is not None and "cuda-pathfinder now finds" in out["error"]
    assert str(copy) in out["error"] and "try again" in out["error"]
    # ...and the compile, its headers checked, keyed and compiled with pathfinder's
    assert out["again"] == "compiled" and out["now"] == wheel
    assert _include_entry(isolated_cache)[1]["dirs"] == wheel


_DIGEST_CHILD = """
import json, sys
from cuforge.toolchain import installed
installed._SETTLED_NS = 0  # the file was just written: remember its digest all the same
real, hashed = installed.hash_file, []
installed.hash_file = lambda p: hashed.append(p) or real(p)
path = sys.argv[1]
print(json.dumps({"sha": installed.file_sha256(path), "hashed": len(hashed),
                  "recorded": installed.recorded_sha256(path)}))
"""


def test_a_files_digest_is_remembered_under_its_ctime_so_a_same_size_edit_is_seen(tmp_path):
    """A warm cache dir hashes nothing; a same-size edit with its mtime put back (``touch
    -r``) keeps size, mtime and inode but not ctime: a fresh process hashes it again, and
    RECORD no longer vouches for it."""
    import hashlib

    content = b"\x7fELF" + bytes(range(256)) * 8
    path = _fake_site(tmp_path, content)
    argv = f"import sys; sys.argv[1:] = [{path!r}]\n"

    def child():
        return run_python(argv + _DIGEST_CHILD, env=child_env())

    cold, warm = child(), child()
    expected = hashlib.sha256(content).hexdigest()
    assert cold == {"sha": expected, "hashed": 1, "recorded": expected}
    assert warm == {"sha": expected, "hashed": 0, "recorded": expected}
    before = os.stat(path)
    edited = b"\x7fELG" + content[4:]
    with open(path, "r+b") as f:  # in place: the same inode
        f.write(edited)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )
    again = child()
    assert again == {"sha": hashlib.sha256(edited).hexdigest(), "hashed": 1, "recorded": None}
