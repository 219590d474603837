"""A CI-built extension loads on a developer's machine without running a compiler: the
torch path's objects, links and modules go through the remote tiers too (issue 10
section 5). Two "machines": two local cache dirs, two checkouts at different paths, one
shared file:// remote; compiler calls are counted by the wrapped nvcc / c++."""

from __future__ import annotations

import pytest

from tests.torch.conftest import Ext


@pytest.mark.slow
def test_an_extension_built_on_one_machine_loads_on_another_without_compiling(
    tmp_path, torch_env, monkeypatch
):
    from cuforge import default_cache
    from cuforge.torch import build_extension

    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("CUFORGE_REMOTE", f"file://{shared}")
    # signed: modules and objects are host code, refused from a remote that checks no
    # signature (tests/store/test_remote_file.py)
    monkeypatch.setenv("CUFORGE_REMOTE_KEY", "team-secret")
    ci = Ext(str(tmp_path / "ci" / "checkout"))
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "ci-cache"))
    built = build_extension(ci.spec())
    assert built.source in ("built", "objects") and torch_env.compiles() >= 1

    torch_env.reset()
    dev = Ext(str(tmp_path / "laptop" / "somewhere" / "else"))
    dev.write(dev.kernels, ci.read(ci.kernels))  # the same sources, another path
    monkeypatch.setenv("CUFORGE_CACHE_DIR", str(tmp_path / "dev-cache"))
    loaded = build_extension(dev.spec())
    assert torch_env.compiles() == 0 and torch_env.links() == 0
    assert loaded.key == built.key
    stats = default_cache().store.stats().extra["tiers"]
    assert stats["remote"]["hits"] >= 1, stats
