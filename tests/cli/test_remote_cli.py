"""`cuforge cache push / pull`, the remote rows of `cache stats` and `cuforge doctor`'s
remote check, as subprocesses against real remotes: a file:// directory (no server needed)
and, where redis-server is installed, a real Redis on a random loopback port."""

from __future__ import annotations

import socket

import pytest

from tests.cli.conftest import Cli, compile_in_child

#: redis_server, nginx_server and black_hole: real servers on loopback ports


def _rows(doc: dict) -> list[dict]:
    return [c for c in doc["checks"] if c["id"] == "remote"]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def remote_url(tmp_path) -> str:
    shared = tmp_path / "shared"  # a shared dir is made once, by whoever sets it up
    shared.mkdir()
    return "file://" + str(shared)


def _pull_and_compile(tmp_path, cache: dict, url: str, **env: str) -> tuple[dict, dict]:
    """Pull into a fresh cache dir, then compile the test kernels there (no remote set)."""
    fresh = str(tmp_path / "fresh-cache")
    pulled = Cli(fresh).json("cache", "pull", "--remote", url, env=env)
    warm = compile_in_child(fresh, cache["jobs"])
    return pulled, warm


# -- push / pull --------------------------------------------------------------------------


def test_push_then_pull_into_a_fresh_cache_compiles_nothing(cli, cache, tmp_path, remote_url):
    pushed = cli.json("cache", "push", "--remote", remote_url)
    assert pushed["command"] == "cache push" and pushed["ok"] is True
    (r,) = pushed["remotes"]
    assert r["direction"] == "push" and r["index"] == "default" and r["index_written"] is True
    assert r["selected"] == r["copied"] == 8  # 4 kernels + their 4 manifests
    assert r["failed"] == [] and r["bytes"] > 0
    pulled, warm = _pull_and_compile(tmp_path, cache, remote_url)
    (p,) = pulled["remotes"]
    assert pulled["ok"] is True and p["copied"] == 8 and p["failed"] == []
    assert warm["compiles"] == 0
    assert {x["from"] for x in warm["results"]} == {"disk"}
    assert {x["name"]: x["key"] for x in warm["results"]} == {
        k: v for k, v in cache["keys"].items()
    }
    # a second pull finds everything present
    again = Cli(str(tmp_path / "fresh-cache")).json("cache", "pull", "--remote", remote_url)
    assert again["remotes"][0]["present"] == 8 and again["remotes"][0]["copied"] == 0


def test_stats_shows_the_remote_tier_after_remote_hits(cli, cache, tmp_path, remote_url):
    cli.json("cache", "push", "--remote", remote_url)
    fresh = str(tmp_path / "reader")
    warm = compile_in_child(fresh, cache["jobs"], CUFORGE_REMOTE=remote_url)
    assert warm["compiles"] == 0 and {x["from"] for x in warm["results"]} == {"remote"}
    reader = Cli(fresh)
    doc = reader.json("cache", "stats", env={"CUFORGE_REMOTE": remote_url})
    # the 3 kernels, once each (their manifests, found first, are not hits: was 6)
    assert doc["tiers"]["remote"]["hits"] == 3 == doc["lookups"]["hits"]
    assert doc["tiers"]["remote"]["errors"] == 0
    human = reader("cache", "stats", env={"CUFORGE_REMOTE": remote_url}).stdout
    assert "errors" in human and "rejected" in human
    assert any(line.split()[:2] == ["remote", "3"] for line in human.splitlines()), human


def test_push_uses_cuforge_remote_and_filters(cli, remote_url, tmp_path):
    doc = cli.json("cache", "push", "--kind", "kernel", env={"CUFORGE_REMOTE": remote_url})
    (r,) = doc["remotes"]
    assert r["copied"] == 4 and r["selected"] == 4
    human = cli("cache", "push", "--name", "saxpy", env={"CUFORGE_REMOTE": remote_url})
    assert human.returncode == 0, human.stderr
    assert "pushed" in human.stdout and "index default" in human.stdout


def test_push_and_pull_refuse_without_a_remote(cli):
    for command in ("push", "pull"):
        done = cli("cache", command)
        assert done.returncode == 1
        assert "CUFORGE_REMOTE" in done.stderr and "--remote" in done.stderr


def test_pull_without_a_push_index_fails_and_says_push_first(tmp_path, remote_url):
    doc = Cli(str(tmp_path / "c")).json("cache", "pull", "--remote", remote_url, ok=False)
    assert doc["_rc"] == 1 and doc["ok"] is False
    (failure,) = doc["remotes"][0]["failed"]
    assert "cuforge cache push" in failure["reason"]


def test_named_indexes_are_separate(cli, tmp_path, remote_url):
    cli.json("cache", "push", "--remote", remote_url, "--index", "ci-main", "--kind", "kernel")
    fresh = Cli(str(tmp_path / "fresh"))
    assert (
        fresh.json("cache", "pull", "--remote", remote_url, "--index", "ci-main")["remotes"][0][
            "copied"
        ]
        == 4
    )
    missing = fresh.json("cache", "pull", "--remote", remote_url, ok=False)
    assert missing["_rc"] == 1  # nothing was pushed under "default"


def test_signed_push_is_refused_by_a_reader_with_another_key(cli, cache, tmp_path, remote_url):
    cli.json("cache", "push", "--remote", remote_url, env={"CUFORGE_REMOTE_KEY": "team-secret"})
    fresh = Cli(str(tmp_path / "wrong-key"))
    bad = fresh.json(
        "cache",
        "pull",
        "--remote",
        remote_url,
        ok=False,
        env={"CUFORGE_REMOTE_KEY": "another-secret"},
    )
    assert bad["_rc"] == 1 and bad["ok"] is False
    assert bad["remotes"][0]["copied"] == 0
    pulled, warm = _pull_and_compile(tmp_path, cache, remote_url, CUFORGE_REMOTE_KEY="team-secret")
    assert pulled["remotes"][0]["copied"] == 8 and warm["compiles"] == 0


def test_push_in_read_only_mode_refuses(cli, remote_url):
    done = cli("cache", "push", "--remote", remote_url, env={"CUFORGE_REMOTE_READONLY": "1"})
    assert done.returncode == 1 and "CUFORGE_REMOTE_READONLY" in done.stderr


def test_stats_lists_the_configured_remotes_without_their_password(cli):
    env = {"CUFORGE_REMOTE": "redis://:hunter2@127.0.0.1:1/0", "CUFORGE_REMOTE_READONLY": "1"}
    doc = cli.json("cache", "stats", env=env)
    assert doc["remotes"] == [
        {"url": "redis://:***@127.0.0.1:1/0", "readonly": True, "signed": False}
    ]
    human = cli("cache", "stats", env=env)
    assert "remote      redis://:***@127.0.0.1:1/0 (read-only)" in human.stdout
    assert "hunter2" not in human.stdout + human.stderr


# -- doctor -------------------------------------------------------------------------------


def test_doctor_remote_pass_for_a_working_remote(cli, remote_url):
    doc = cli.json("doctor", "--check", "remote", ok=False, env={"CUFORGE_REMOTE": remote_url})
    (row,) = _rows(doc)
    assert row["status"] == "PASS", row
    assert row["data"]["reachable"] is True and row["data"]["writable"] is True
    assert row["data"]["latency_ms"] >= 0 and "unsigned" in row["detail"]
    signed = cli.json(
        "doctor",
        "--check",
        "remote",
        ok=False,
        env={"CUFORGE_REMOTE": remote_url, "CUFORGE_REMOTE_KEY": "k"},
    )
    (row,) = _rows(signed)
    assert row["status"] == "PASS" and row["data"]["verified"] is True, row
    readonly = cli.json(
        "doctor",
        "--check",
        "remote",
        ok=False,
        env={"CUFORGE_REMOTE": remote_url, "CUFORGE_REMOTE_READONLY": "1"},
    )
    (row,) = _rows(readonly)
    assert row["status"] == "PASS" and row["data"]["writable"] is None
    assert "read-only" in row["detail"]


def test_doctor_remote_fail_with_the_fix_for_a_closed_port(cli):
    url = f"http://127.0.0.1:{_closed_port()}/cache"
    doc = cli.json("doctor", "--check", "remote", ok=False, env={"CUFORGE_REMOTE": url})
    (row,) = _rows(doc)
    assert row["status"] == "FAIL" and row["data"]["reachable"] is False, row
    assert "unreachable" in row["detail"] and "CUFORGE_REMOTE" in row["fix"]
    assert doc["ok"] is False and doc["_rc"] == 1
    human = cli("doctor", "--check", "remote", env={"CUFORGE_REMOTE": url})
    lines = human.stdout.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("FAIL  remote cache")]
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("    "))
    block = lines[start:end]  # the row, wrapped with a hanging indent, and its fix
    assert all(len(line) <= 80 for line in block), block
    fix = [i for i, line in enumerate(block) if line.lstrip().startswith("fix: ")]
    assert fix and all(line.startswith(" " * 33) for line in block[fix[0] + 1 :]), block


def test_doctor_remote_skipped_when_none_is_configured(cli):
    (row,) = _rows(cli.json("doctor", "--check", "remote", ok=False))
    assert row["status"] == "SKIP" and "CUFORGE_REMOTE" in row["detail"]


# -- a real Redis -----------------------------------------------------------------------


@pytest.mark.parametrize("server", ["redis_server", "nginx_server"])
def test_push_pull_through_a_real_server(cli, cache, tmp_path, server, request):
    url = request.getfixturevalue(server).url
    pushed = cli.json("cache", "push", "--remote", url, env={"CUFORGE_REMOTE_KEY": "ci-key"})
    assert pushed["remotes"][0]["copied"] == 8
    pulled, warm = _pull_and_compile(tmp_path, cache, url, CUFORGE_REMOTE_KEY="ci-key")
    assert pulled["remotes"][0]["copied"] == 8 and warm["compiles"] == 0
    env = {"CUFORGE_REMOTE": url, "CUFORGE_REMOTE_KEY": "ci-key"}
    (row,) = _rows(cli.json("doctor", "--check", "remote", ok=False, env=env))
    assert row["status"] == "PASS" and row["data"]["verified"] is True, row


def test_doctor_remote_fail_for_a_closed_redis_port(cli):
    pytest.importorskip("redis")
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    (row,) = _rows(cli.json("doctor", "--check", "remote", ok=False, env={"CUFORGE_REMOTE": url}))
    assert row["status"] == "FAIL" and "CUFORGE_REMOTE" in row["fix"], row


def test_doctor_remote_fail_for_a_server_that_never_answers(cli, black_hole):
    (row,) = _rows(
        cli.json(
            "doctor", "--check", "remote", ok=False, env={"CUFORGE_REMOTE": black_hole.url("http")}
        )
    )
    assert row["status"] == "FAIL" and row["data"]["reachable"] is False, row


def test_push_and_pull_carry_every_entry_kind(tmp_path, remote_url):
    """Integration entries (cute, cccl, triton, jax, ...) travel through push / pull too,
    not only kernels and what they point at. (Native host code -- objects, modules,
    Inductor's C++ kernels -- comes from this unsigned remote only when allowed.)"""
    import hashlib

    from cuforge import Cache
    from cuforge.store.base import ENTRY_KINDS, Entry

    source = Cache(str(tmp_path / "writer"))
    keys = {}
    for kind in ENTRY_KINDS:
        if kind == "manifest":
            continue  # a manifest's payload has a schema of its own; pushed by the kernel tests
        key = hashlib.sha256(kind.encode()).hexdigest()
        meta = {"name": kind, "cache": "fx_graph"} if kind == "inductor" else {"name": kind}
        if kind == "flashinfer":
            meta["native_module"] = True  # the schema: a flashinfer entry says it is native
        assert source.put(Entry(key, kind, f"payload of {kind}".encode(), meta))
        keys[kind] = key
    pushed = Cli(str(tmp_path / "writer")).json("cache", "push", "--remote", remote_url)
    assert pushed["ok"] is True
    assert pushed["remotes"][0]["copied"] == len(keys)
    pulled = Cli(str(tmp_path / "reader")).json(
        "cache", "pull", "--remote", remote_url, env={"CUFORGE_REMOTE_NATIVE": "allow"}
    )
    assert pulled["ok"] is True and pulled["remotes"][0]["copied"] == len(keys)
    reader = Cache(str(tmp_path / "reader"))
    for kind, key in keys.items():
        entry, tier = reader.get_with_tier(key, kind=kind)
        assert tier == "disk" and entry.payload == f"payload of {kind}".encode()
