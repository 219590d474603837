"""Issue 35, "Signatures, cost where it counts": one verification per remote hit of a
direct-mode kernel, none on a local hit, and a local copy refused once its signer is
revoked.

Everything is real: key files written by ``cuforge keys generate``, a real shared directory
as the remote (``file://``), kernels compiled by NVRTC in fresh processes. Verifications
are counted by wrapping ``TrustedKey.verify`` (the one place an Ed25519 signature is
checked) with a counter that calls the real one.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("cryptography", reason="pip install 'cuforge[sign]' (cryptography)")

from cuforge.base import signing
from cuforge.store.base import Entry
from cuforge.store.remote.envelope import namespace
from cuforge.store.remote.file import FileBackend
from cuforge.store.remote.tier import RemoteStore
from tests.base.test_signing import _keys
from tests.child import child_env, run_python
from tests.store.helpers import key_of

HEADER = "#define SCALE 2.0f\n"
KERNEL = """#include "scale.h"
extern "C" __global__ void scale(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= SCALE;
}
"""

#: compile the kernel once; how it was served, how many compiles and Ed25519 verifications
#: it took, and the remote tier's counters (None when no remote was opened)
CHILD = """
import json, cuforge
from cuforge.base import signing
from cuforge.core.pipeline import counters

calls = []
real = signing.TrustedKey.verify

def counted(self, signature, message):
    calls.append(1)
    return real(self, signature, message)

signing.TrustedKey.verify = counted
p = cuforge.compile_file({src!r})
tiers = cuforge.default_cache().stats().extra["tiers"]
remote = tiers.get("remote", {{}}).get("extra", {{}})
print(json.dumps({{
    "source": p.source_of_result,
    "compiles": counters["compiles"],
    "verified": len(calls),
    "tier_verified": remote.get("verified"),
    "vouched": remote.get("vouched"),
    "rejected": tiers.get("remote", {{}}).get("rejected"),
    "key": p.key,
}}))
"""


def _setup(tmp_path):
    keys, ring = _keys(tmp_path, "ci")
    shared = tmp_path / "shared"
    shared.mkdir()
    src = tmp_path / "scale.cu"
    src.write_text(KERNEL)
    (tmp_path / "scale.h").write_text(HEADER)
    code = CHILD.format(src=str(src))
    remote = f"file://{shared}"
    writer = child_env(
        CUFORGE_CACHE_DIR=str(tmp_path / "writer"),
        CUFORGE_REMOTE=remote,
        CUFORGE_SIGNING_KEY=str(tmp_path / "keys" / "ci.key"),
    )
    reader = child_env(
        CUFORGE_CACHE_DIR=str(tmp_path / "reader"), CUFORGE_REMOTE=remote, CUFORGE_TRUSTED_KEYS=ring
    )
    return keys, ring, shared, code, writer, reader


def _without_counters(result: dict) -> dict:
    return {k: result[k] for k in ("source", "compiles", "verified")}


def test_a_remote_hit_of_a_direct_mode_kernel_verifies_one_signature_and_a_local_hit_none(
    tmp_path,
):
    """The manifest and the kernel came from the remote: 2 verifications before; now the
    signed manifest names the kernel's digest, so its one signature covers both. The next
    process hits the local copy: no verification at all."""
    _, _, _, code, writer, reader = _setup(tmp_path)
    wrote = run_python(code, writer)
    assert _without_counters(wrote) == {"source": "compiled", "compiles": 1, "verified": 0}
    remote_hit = run_python(code, reader)
    assert _without_counters(remote_hit) == {"source": "remote", "compiles": 0, "verified": 1}
    assert (remote_hit["tier_verified"], remote_hit["vouched"]) == (1, 1)
    local_hit = run_python(code, reader)
    assert _without_counters(local_hit) == {"source": "disk", "compiles": 0, "verified": 0}


def test_bytes_the_signed_manifest_does_not_name_are_verified_and_unsigned_ones_refused(tmp_path):
    """The shortcut covers exactly the bytes the signed manifest names: a kernel replaced
    on the remote by other, unsigned bytes is checked, refused, and built here."""
    _, ring, shared, code, writer, reader = _setup(tmp_path)
    wrote = run_python(code, writer)
    backend = FileBackend(f"file://{shared}", namespace=namespace(), connect_timeout=0.1, timeout=1)
    planter = RemoteStore(backend)  # no key: writes unsigned envelopes
    assert planter.put(Entry(wrote["key"], "kernel", b"\x7fELF not the kernel", {"name": "x"}))
    got = run_python(code, reader)
    assert (got["source"], got["compiles"]) == ("compiled", 1)
    assert got["rejected"] >= 1 and got["vouched"] == 0  # (looked up again under the lock)
    # and a manifest that is not signed vouches for nothing: refused before it is read
    keyring = signing.load_keyring(ring)
    tier = RemoteStore(backend, keyring=keyring)
    assert tier.get(key_of("m"), kind="manifest") is None
    assert planter.put(
        Entry(
            key_of("m"),
            "manifest",
            b"",
            {"variants": [], "sealed": {wrote["key"]: "0" * 64}},
        )
    )
    assert tier.get(key_of("m"), kind="manifest") is None and tier.rejected == 1
    assert tier._vouches == {}


def test_a_local_copy_whose_signer_is_revoked_is_refused_and_rebuilt(tmp_path, caplog):
    """Signed with K, copied into the reader's local cache by a remote hit; K revoked (by
    key id) in the keyring: the next process refuses its local copy by a key-id lookup
    (no verification), says why once, and builds it (1 compile); the build is then a
    plain local hit."""
    keys, ring, _, code, writer, reader = _setup(tmp_path)
    run_python(code, writer)
    assert run_python(code, reader)["source"] == "remote"
    assert signing.revoke(ring, keys["ci"].kid) == 1  # by key, not by name
    refused = run_python(code, {**reader, "CUFORGE_REMOTE": ""})
    assert _without_counters(refused) == {"source": "compiled", "compiles": 1, "verified": 0}
    again = run_python(code, reader)
    assert _without_counters(again) == {"source": "disk", "compiles": 0, "verified": 0}


def test_the_refusal_of_a_revoked_local_copy_is_logged_once(tmp_path, caplog, monkeypatch):
    """In process: the local copy carries the signer's kid; after the revocation a hit is
    a miss, the copy is deleted, and one warning names the key."""
    import logging

    import cuforge

    keys, ring = _keys(tmp_path, "ci")
    shared = tmp_path / "shared"
    shared.mkdir()
    backend = FileBackend(f"file://{shared}", namespace=namespace(), connect_timeout=0.1, timeout=1)
    entries = [Entry(key_of(i), "kernel", os.urandom(300), {"name": f"k{i}.cu"}) for i in (1, 2)]
    writer = RemoteStore(backend, signer=keys["ci"])
    for e in entries:
        assert writer.put(e)
    monkeypatch.setenv("CUFORGE_TRUSTED_KEYS", ring)
    monkeypatch.setenv("CUFORGE_REMOTE", f"file://{shared}")
    cache = cuforge.Cache(tmp_path / "local", remotes=[f"file://{shared}"])
    for e in entries:
        entry, tier = cache.get_with_tier(e.key, kind="kernel")
        assert tier == "remote" and entry.meta["signer_kid"] == keys["ci"].kid
    signing.revoke(ring, "ci")
    caplog.set_level(logging.WARNING, logger="cuforge")
    fresh = cuforge.Cache(tmp_path / "local", remotes=[])  # a later process: local only
    for e in entries:
        assert fresh.get_with_tier(e.key, kind="kernel") == (None, None)
    disk = fresh.store.tiers[1]
    assert all(disk.get(e.key, kind="kernel") is None for e in entries)  # deleted
    assert fresh.store.stats().extra["refused_revoked"] == 2
    lines = [r.getMessage() for r in caplog.records if "revokes" in r.getMessage()]
    assert len(lines) == 1 and "'ci'" in lines[0] and keys["ci"].kid in lines[0]
