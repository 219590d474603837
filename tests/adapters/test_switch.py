"""``cuforge.enable(*systems, cache=None)``: one call for every system, a report of what
each one did, names checked before anything changes, no peer imported to decide what is
installed; and the after-import hook ``CUFORGE_ENABLE`` arms (:func:`switch.arm`)."""

from __future__ import annotations

import sys

import pytest

import cuforge
from cuforge.adapters import switch
from tests.conftest import run_python


def test_enable_is_a_lazy_public_name_not_loaded_by_import_cuforge():
    report = run_python(
        """
        import json, sys
        import cuforge
        loaded = "cuforge.adapters.switch" in sys.modules
        from cuforge.adapters.switch import enable
        print(json.dumps({"loaded": loaded, "same": cuforge.enable is enable,
                          "listed": "enable" in cuforge.__all__}))
        """
    )
    assert report == {"loaded": False, "same": True, "listed": True}


def test_enable_of_everything_reports_each_installed_system():
    """In a child (enabling torch.compile changes torch's config for the process)."""
    pytest.importorskip("triton")
    report = run_python(
        """
        import json, sys
        import cuforge
        result = cuforge.enable()
        import cuforge.triton
        print(json.dumps({"result": result, "triton": cuforge.triton.enabled()}))
        """
    )
    result = report["result"]
    expected = [n for n in switch.names() if switch.installed(n)]
    assert list(result) == expected  # registry order, only what is installed
    assert result["triton"] == "enabled" and report["triton"] is True
    if "cuda_core" in result:
        assert "no global default program cache" in result["cuda_core"]
    for name in ("jax", "cupy"):
        assert name in result or not switch.installed(name)


def test_a_named_system_that_is_not_installed_says_so(monkeypatch):
    monkeypatch.setitem(
        switch.SYSTEMS,
        "nosuch",
        switch.System("nosuch", peer="cuforge_no_such_peer", adapter="x", kinds=(), extra="nosuch"),
    )
    result = cuforge.enable("nosuch")
    assert result == {
        "nosuch": "not installed (no module 'cuforge_no_such_peer'; pip install 'cuforge[nosuch]')"
    }


def test_cuda_core_reports_why_it_has_no_switch():
    pytest.importorskip("cuda.core")
    (reason,) = cuforge.enable("cuda_core").values()
    assert reason.startswith("cuda.core has no global default program cache")


def test_an_unknown_name_raises_listing_the_names_before_anything_changes():
    with pytest.raises(ValueError) as info:
        cuforge.enable("triton", "tritn")
    message = str(info.value)
    assert "'tritn'" in message
    assert "triton, torch_compile, jax, cupy, cuda_core, cute, cccl" in message
    if "cuforge.adapters.triton" in sys.modules:
        assert not sys.modules["cuforge.adapters.triton"].enabled()


def test_a_wrong_cache_argument_is_named():
    with pytest.raises(TypeError, match=r"cache= must be a cuforge.Cache or None, not str"):
        cuforge.enable("triton", cache="/tmp/dir")


def test_a_version_outside_the_window_is_the_adapters_own_message_every_time():
    pytest.importorskip("triton")
    report = run_python(
        """
        import json
        import cuforge
        import cuforge.adapters.triton as t
        t.SUPPORTED = ((99, 0), (99, 1))
        t._probe = lambda: "the probe found no CacheManager protocol"  # outside, and refused
        first = cuforge.enable("triton")["triton"]
        second = cuforge.enable("triton")["triton"]  # (the adapter warns only once)
        print(json.dumps({"first": first, "second": second, "enabled": t.enabled()}))
        """
    )
    assert "contract probe failed: the probe found no CacheManager protocol" in report["first"]
    assert report["second"] == report["first"]
    assert report["enabled"] is False


def test_deciding_what_is_installed_imports_no_peer():
    report = run_python(
        """
        import json, sys
        from cuforge.adapters import switch
        found = {n: switch.installed(n) for n in switch.names()}
        heavy = [m for m in ("torch", "triton", "jax", "cupy", "cutlass", "cuda.core",
                             "cuda.compute") if m in sys.modules]
        print(json.dumps({"found": found, "heavy": heavy}))
        """
    )
    assert report["heavy"] == []
    assert set(report["found"]) == set(switch.names())


def test_every_system_kind_maps_back_to_its_system():
    for system in switch.SYSTEMS.values():
        for kind in system.kinds:
            assert switch.system_of_kind(kind) == system.name
    assert switch.system_of_kind("cubin") is None


# -- the after-import hook (what CUFORGE_ENABLE arms) ------------------------------------


@pytest.fixture
def fake_peer(tmp_path, monkeypatch):
    """A real importable peer package and a real adapter module whose enable() records its
    call (or raises, when the peer's module says so), registered as system ``fake``."""
    (tmp_path / "fakepeer").mkdir()
    (tmp_path / "fakepeer" / "__init__.py").write_text("BROKEN = False\n")
    (tmp_path / "fakeadapter.py").write_text(
        "import fakepeer\n"
        "calls = []\n"
        "def enable(cache=None):\n"
        "    if fakepeer.BROKEN:\n"
        "        raise RuntimeError('the peer changed its hook')\n"
        "    calls.append(cache)\n"
        "    return True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        switch.SYSTEMS,
        "fake",
        switch.System("fake", peer="fakepeer", adapter="fakeadapter", kinds=(), extra="fake"),
    )
    for name in ("fakepeer", "fakeadapter"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield tmp_path
    if switch._hook in sys.meta_path:
        sys.meta_path.remove(switch._hook)
    switch._hook.pending.pop("fakepeer", None)


def test_arm_enables_a_system_right_after_its_peer_is_imported(fake_peer):
    lines: list[str] = []
    switch.arm(["fake"], explicit=True, report=lines.append)
    assert "fakeadapter" not in sys.modules and switch._hook in sys.meta_path
    import fakepeer  # noqa: F401

    assert sys.modules["fakeadapter"].calls == [None]
    assert lines == []
    # the module keeps its real loader, and the finder leaves once nothing is pending
    assert type(fakepeer.__loader__).__name__ == "SourceFileLoader"
    assert fakepeer.__spec__.loader is fakepeer.__loader__
    assert switch._hook not in sys.meta_path


def test_an_adapter_failing_in_the_hook_is_one_line_and_the_import_succeeds(fake_peer):
    (fake_peer / "fakepeer" / "__init__.py").write_text("BROKEN = True\n")
    lines: list[str] = []
    switch.arm(["fake"], explicit=True, report=lines.append)
    import fakepeer

    assert fakepeer.BROKEN is True
    assert lines == ["fake could not be enabled: RuntimeError: the peer changed its hook"]
