"""Ed25519 signatures: writers sign with a private key, readers trust only a keyring.

Everything is real: key files written by ``cuforge keys generate``, a real shared directory
as the remote (file://), real bundle files, real child processes for import costs.
"""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("cryptography", reason="pip install 'cuforge[sign]' (cryptography)")

from cuforge.base import signing
from cuforge.cli.main import main as cli
from cuforge.store.base import Entry
from cuforge.store.bundle import BundleError, BundleStore, write_bundle_file
from cuforge.store.remote.envelope import MAGIC, namespace, seal
from cuforge.store.remote.file import FileBackend
from cuforge.store.remote.tier import RemoteStore
from tests.child import child_env, run_python
from tests.store.helpers import key_of


def _entry(i: int = 1, meta: dict | None = None) -> Entry:
    return Entry(key_of(i), "kernel", os.urandom(2000), {"name": f"k{i}.cu", **(meta or {})})


def _keys(tmp_path, *names: str) -> tuple[dict[str, signing.SigningKey], str]:
    """Key pairs ``names`` (made by the CLI) and a keyring trusting all of them."""
    ring = tmp_path / "trusted"
    out = {}
    for name in names:
        assert cli(["keys", "generate", "--name", name, "--dir", str(tmp_path / "keys"),
                    "--keyring", str(ring)]) == 0  # fmt: skip
        out[name] = signing.load_signing_key(str(tmp_path / "keys" / f"{name}.key"))
    return out, str(ring)


def _tier(tmp_path, **kw) -> RemoteStore:
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    backend = FileBackend(f"file://{shared}", namespace=namespace(), connect_timeout=0.1, timeout=1)
    return RemoteStore(backend, **kw)


def test_generate_writes_a_private_key_only_its_owner_reads(tmp_path):
    keys, ring = _keys(tmp_path, "ci")
    key_file = tmp_path / "keys" / "ci.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    pub = (tmp_path / "keys" / "ci.pub").read_text().split()
    assert pub == ["ci", f"ed25519:{keys['ci'].public.hex()}"]
    assert open(ring).read().split() == pub
    # a key file others can read is refused (whoever reads it could sign)
    key_file.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        signing.load_signing_key(str(key_file))
    # never overwritten
    assert cli(["keys", "generate", "--name", "ci", "--dir", str(tmp_path / "keys")]) == 1


def test_signed_round_trip_names_the_writer(tmp_path):
    keys, ring = _keys(tmp_path, "ci")
    writer = _tier(tmp_path, signer=keys["ci"])
    reader = _tier(tmp_path, keyring=signing.load_keyring(ring))
    e = _entry(1, {"signer": "someone-else"})  # a claim in meta is never kept
    assert writer.put(e)
    got = reader.get(e.key, kind="kernel")
    assert got is not None and got.payload == e.payload
    assert got.meta["signer"] == "ci"
    # a reader without a keyring reads it too, but names no writer
    plain = _tier(tmp_path).get(e.key, kind="kernel")
    assert plain is not None and "signer" not in plain.meta


def test_a_reader_cannot_forge_an_entry_another_reader_accepts(tmp_path):
    keys, ring = _keys(tmp_path, "ci")
    keyring = signing.load_keyring(ring)
    shared = _tier(tmp_path)  # the raw backend, as a reader with write access sees it
    backend, ns = shared.backend, shared.namespace
    # 1. a reader's own tier does not even publish (it holds no signing key)
    reader_a = _tier(tmp_path, keyring=keyring)
    assert reader_a.put(_entry(1)) is False and backend.get("kernel", key_of(1)) is None
    # 2. unsigned, 3. signed with the reader's own key, 4. a real signature on other bytes
    rogue = signing.SigningKey("ci", os.urandom(32))  # even under the trusted key's name
    good = seal(_entry(4), ns, signer=keys["ci"])
    header_end = 9 + int.from_bytes(good[5:9], "little")
    header = json.loads(good[9:header_end])
    forged_body = seal(_entry(4), ns)[9 + int.from_bytes(seal(_entry(4), ns)[5:9], "little") :]
    import hashlib

    header["sha256"] = hashlib.sha256(forged_body).hexdigest()  # the signature stays
    raw = json.dumps(header).encode()
    spliced = MAGIC + bytes((1,)) + len(raw).to_bytes(4, "little") + raw + forged_body
    attempts = {
        2: seal(_entry(2), ns),
        3: seal(_entry(3), ns, signer=rogue),
        4: spliced,
    }
    for i, data in attempts.items():
        backend.put("kernel", key_of(i), data)
    reader_b = _tier(tmp_path, keyring=keyring)
    for i in attempts:
        assert reader_b.get(key_of(i), kind="kernel") is None, i
    assert reader_b.rejected == 3 and reader_b.hits == 0
    # the genuine entry, as written, is accepted (the refusals are about the forgeries)
    backend.put("kernel", key_of(4), good)
    assert reader_b.get(key_of(4), kind="kernel") is not None


def test_the_entry_message_is_the_length_prefixed_fields():
    """The signed bytes never change across versions (stored entries stay valid): the
    domain and each field, each after its length (4 bytes, little endian)."""

    def frame(part: bytes) -> bytes:
        return len(part).to_bytes(4, "little") + part

    fields = ("v1-abc", "kernel", "a" * 64, "b" * 64)
    want = b"".join(frame(p) for p in (b"cuforge-remote-ed25519-v1", *(f.encode() for f in fields)))
    assert signing.entry_message(*fields) == want
    assert signing.entry_message("ns", "k", "é", "") == b"".join(
        frame(p) for p in (b"cuforge-remote-ed25519-v1", b"ns", b"k", "é".encode(), b"")
    )


def test_replay_under_another_key_is_refused(tmp_path):
    keys, ring = _keys(tmp_path, "ci")
    writer = _tier(tmp_path, signer=keys["ci"])
    e = _entry(1)
    assert writer.put(e)
    backend = writer.backend
    data = backend.get("kernel", e.key)
    end = 9 + int.from_bytes(data[5:9], "little")
    header = json.loads(data[9:end])
    header["key"] = key_of(2)  # the same signed bytes, claimed for another key
    raw = json.dumps(header).encode()
    backend.put(
        "kernel", key_of(2), MAGIC + bytes((1,)) + len(raw).to_bytes(4, "little") + raw + data[end:]
    )
    backend.put("kernel", key_of(3), data)  # or copied as is
    reader = _tier(tmp_path, keyring=signing.load_keyring(ring))
    assert reader.get(key_of(2), kind="kernel") is None
    assert reader.get(key_of(3), kind="kernel") is None
    assert reader.get(e.key, kind="kernel") is not None


def test_rotation_and_revocation(tmp_path):
    keys, ring = _keys(tmp_path, "ci-old", "ci-new")
    old, new = _entry(1), _entry(2)
    assert _tier(tmp_path, signer=keys["ci-old"]).put(old)
    assert _tier(tmp_path, signer=keys["ci-new"]).put(new)
    reader = _tier(tmp_path, keyring=signing.configured_keyring(ring))
    assert reader.get(old.key, kind="kernel").meta["signer"] == "ci-old"
    assert reader.get(new.key, kind="kernel").meta["signer"] == "ci-new"
    assert signing.revoke(ring, "ci-old") == 1
    reader = _tier(tmp_path, keyring=signing.configured_keyring(ring))  # the file changed
    assert reader.get(old.key, kind="kernel") is None
    assert reader.rejected == 1
    assert reader.get(new.key, kind="kernel").meta["signer"] == "ci-new"
    # a key nobody lists any more is unknown: refused too
    kept = open(ring).read().splitlines()[1]
    with open(ring, "w") as f:
        f.write(kept + "\n")
    reader = _tier(tmp_path, keyring=signing.configured_keyring(ring))
    assert reader.get(old.key, kind="kernel") is None


def test_revoke_drops_local_copies_and_cache_show_names_the_writer(
    tmp_path, isolated_cache, capsys
):
    from cuforge.store.disk import DiskStore

    keys, ring = _keys(tmp_path, "ci")
    e = _entry(1)
    assert _tier(tmp_path, signer=keys["ci"]).put(e)
    got = _tier(tmp_path, keyring=signing.load_keyring(ring)).get(e.key, kind="kernel")
    local = DiskStore(str(isolated_cache), 1 << 30)
    assert local.put(got)  # what the chain does with a remote hit
    capsys.readouterr()
    assert cli(["cache", "show", e.key]) == 0
    shown = capsys.readouterr().out
    assert any(line.split() == ["signer", "ci"] for line in shown.splitlines()), shown
    assert cli(["keys", "revoke", "ci", "--keyring", ring]) == 0
    assert "deleted 1 local cache entries" in capsys.readouterr().out
    assert local.get(e.key) is None
    assert cli(["keys", "list", "--keyring", ring, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["keys"][0]["status"] == "revoked"


def _bundle(tmp_path, signer, name="b.cfb") -> str:
    path = str(tmp_path / name)
    write_bundle_file(path, [_entry(1), _entry(2)], {"variants": ["a"]}, signer=signer)
    return path


def test_bundles_are_signed_and_verified_offline(tmp_path):
    keys, ring = _keys(tmp_path, "ci")
    keyring = signing.load_keyring(ring)
    signed = _bundle(tmp_path, keys["ci"])
    store = BundleStore(signed, keyring=keyring)
    assert store.signer == "ci"
    assert {e.meta["signer"] for e in store.entries()} == {"ci"}
    assert BundleStore(signed, keyring=None).signer is None  # no keyring: no check
    # unsigned, signed by a stranger, tampered after signing: refused at load
    with pytest.raises(BundleError, match="unsigned"):
        BundleStore(_bundle(tmp_path, None, "u.cfb"), keyring=keyring)
    stranger = signing.SigningKey("ci", os.urandom(32))
    with pytest.raises(BundleError, match="not in the keyring"):
        BundleStore(_bundle(tmp_path, stranger, "s.cfb"), keyring=keyring)
    with open(signed, "rb") as f:
        data = bytearray(f.read())
    index_off = int.from_bytes(data[16:24], "little")
    doc = json.loads(bytes(data[index_off:]))
    doc["entries"][0]["meta"]["name"] = "evil.cu"
    index = json.dumps(doc, sort_keys=True).encode()
    import hashlib
    import struct

    head = struct.pack("<8sIIQQ32s", b"CFBUNDL\0", 1, 0, index_off, len(index),
                       hashlib.sha256(index).digest())  # fmt: skip
    tampered = tmp_path / "t.cfb"
    tampered.write_bytes(head + hashlib.sha256(head).digest() + bytes(data[96:index_off]) + index)
    BundleStore(str(tampered), keyring=None)  # a well-formed bundle...
    with pytest.raises(BundleError, match="bad signature"):
        BundleStore(str(tampered), keyring=keyring)  # ...that no trusted key signed
    signing.revoke(ring, "ci")
    with pytest.raises(BundleError, match="revoked"):
        BundleStore(signed, keyring=signing.load_keyring(ring))


def test_the_environment_signs_and_requires(tmp_path, isolated_cache, monkeypatch):
    """CUFORGE_SIGNING_KEY signs bundles written with no explicit key;
    CUFORGE_TRUSTED_KEYS makes loading require a signature and remotes require it too."""
    from cuforge.base.config import settings
    from cuforge.store.remote import open_remotes

    keys, ring = _keys(tmp_path, "ci")
    monkeypatch.setenv("CUFORGE_SIGNING_KEY", str(tmp_path / "keys" / "ci.key"))
    path = str(tmp_path / "env.cfb")
    write_bundle_file(path, [_entry(1)], {})
    monkeypatch.setenv("CUFORGE_TRUSTED_KEYS", ring)
    assert BundleStore(path).signer == "ci"
    (tmp_path / "shared").mkdir()
    monkeypatch.setenv("CUFORGE_REMOTE", f"file://{tmp_path / 'shared'}")
    (tier,) = open_remotes(settings())
    assert tier.signer.name == "ci" and len(tier.keyring) == 1
    assert tier.put(_entry(5)) and tier.get(key_of(5), kind="kernel").meta["signer"] == "ci"


def test_no_cryptography_import_without_a_keyring_or_a_signature(tmp_path):
    """``import cuforge``, a configured signing key and a local hit import no cryptography;
    the first signature does."""
    keys, ring = _keys(tmp_path, "ci")
    shared = tmp_path / "shared"
    shared.mkdir()
    code = """
        import json, sys
        import cuforge
        from cuforge.store.base import Entry
        before = "cryptography" in sys.modules
        cache = cuforge.default_cache()
        e = Entry("ab" * 32, "kernel", b"x" * 100, {"name": "k.cu"})
        cache.store.tiers[1].put(e)  # the disk tier only
        hit = cache.get_with_tier("ab" * 32, kind="kernel")
        after_hit = "cryptography" in sys.modules
        cache.store.tiers[-1].put(e)  # the remote: signs
        print(json.dumps([before, after_hit, hit is not None, "cryptography" in sys.modules]))
    """
    env = child_env(
        CUFORGE_CACHE_DIR=str(tmp_path / "c"),
        CUFORGE_REMOTE=f"file://{shared}",
        CUFORGE_SIGNING_KEY=str(tmp_path / "keys" / "ci.key"),
    )
    assert run_python(code, env) == [False, False, True, True]


def test_a_keyring_signed_share_serves_native_host_code_and_unsigned_readers_refuse_it(tmp_path):
    """Native host code (a torch module, a Triton C module) signed by a trusted key is
    served; the same share read without a keyring refuses it (issue 35, item 5)."""
    keys, ring = _keys(tmp_path, "ci")
    writer = _tier(tmp_path, signer=keys["ci"])
    module = Entry(key_of(1), "module", os.urandom(900), {"name": "ext"})
    launcher = Entry(key_of(2), "triton", os.urandom(900), {"name": "x", "native_module": True})
    assert writer.put(module) and writer.put(launcher)
    reader = _tier(tmp_path, keyring=signing.load_keyring(ring))
    assert reader.get(module.key, kind="module").payload == module.payload
    assert reader.get(launcher.key, kind="triton").payload == launcher.payload
    plain = _tier(tmp_path)
    assert plain.get(module.key, kind="module") is None
    assert plain.get(launcher.key, kind="triton") is None
    assert plain.stats().extra["refused_native"] == 2


# -- issue 35: revocation by key, canonical signatures, trusted files ---------------------


def test_revoking_a_key_revokes_it_under_every_name(tmp_path):
    """Issue 35 item 3: the same public key under a second name stayed trusted after
    `revoke` marked the first name's line."""
    keys, ring = _keys(tmp_path, "ci")
    public_hex = keys["ci"].public.hex()
    e = _entry(7)
    assert _tier(tmp_path, signer=keys["ci"]).put(e)
    # the same key, revoked under its name, and listed again as "alias" (trusted)
    with open(ring, "w") as f:
        f.write(f"ci ed25519:{public_hex} revoked\nalias ed25519:{public_hex}\n")
    keyring = signing.load_keyring(ring)
    reader = _tier(tmp_path, keyring=keyring)
    assert reader.get(e.key, kind="kernel") is None and reader.rejected == 1
    assert not keyring.trusted_name("alias")
    # `revoke` by one name marks every line of that key, not only the lines of that name
    with open(ring, "w") as f:
        f.write(f"ci ed25519:{public_hex}  # the CI key\n")
    assert signing.revoke(ring, "ci") == 1
    with open(ring, "a") as f:
        f.write(f"alias ed25519:{public_hex}\n")
    assert signing.revoke(ring, "alias") == 1  # the alias line too, found by its key
    assert all(line.split("#")[0].split()[-1] == "revoked" for line in open(ring))
    assert "# the CI key" in open(ring).read()  # the comment is kept, after the mark
    reader = _tier(tmp_path, keyring=signing.load_keyring(ring))
    assert reader.get(e.key, kind="kernel") is None


def test_a_keyring_listing_one_key_under_two_trusted_names_is_refused(tmp_path):
    keys, ring = _keys(tmp_path, "ci")
    line = keys["ci"].public_line()
    with open(ring, "w") as f:
        f.write(f"# keys\n{line}\nalias ed25519:{keys['ci'].public.hex()}\n")
    with pytest.raises(ValueError) as err:
        signing.load_keyring(ring)
    text = str(err.value)
    assert "lines 2 and 3" in text and "'ci'" in text and "'alias'" in text
    assert keys["ci"].kid in text


def test_only_lowercase_hex_signatures_are_accepted(tmp_path):
    """Issue 35 item 17: bytes.fromhex took uppercase digits (and spaces): a second
    spelling of one signature."""
    keys, ring = _keys(tmp_path, "ci")
    keyring = signing.load_keyring(ring)
    message = signing.bundle_message("ab" * 32)
    good = keys["ci"].sign(message)
    assert keyring.check(good, keys["ci"].kid, message) == "ci"
    i = next(i for i, c in enumerate(good) if c in "abcdef")
    one_upper = good[:i] + good[i].upper() + good[i + 1 :]
    for bad in (good.upper(), one_upper, " ".join([good[:64], good[64:]])):
        with pytest.raises(signing.Untrusted, match="128 lowercase hex digits"):
            keyring.check(bad, keys["ci"].kid, message)


def _trusted_file_cases(tmp_path, keys_dir, name: str) -> dict[str, str]:
    """Copies of the file ``keys_dir/name`` in each untrusted place: owned by another user,
    in a 0777 directory, behind a symlink, itself group-writable."""
    import shutil

    data = (keys_dir / name).read_bytes()
    cases = {}
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    (other / name).write_bytes(data)
    os.chmod(other / name, 0o600)
    os.chown(other / name, 1, 1)  # uid 1: another user (the tests run as root)
    cases["another user's file"] = str(other / name)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    shutil.copy(keys_dir / name, open_dir / name)
    os.chmod(open_dir / name, 0o600)
    cases["a 0777 directory"] = str(open_dir / name)
    deep = tmp_path / "open2" / "sub"
    deep.mkdir(parents=True)
    os.chmod(tmp_path / "open2", 0o777)
    shutil.copy(keys_dir / name, deep / name)
    os.chmod(deep / name, 0o600)
    cases["a 0777 grandparent"] = str(deep / name)
    link = tmp_path / f"link-{name}"
    link.symlink_to(keys_dir / name)
    cases["a symlink"] = str(link)
    return cases


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_keyrings_and_private_keys_are_trusted_as_the_cache_dir_is(tmp_path):
    """Issue 35 item 4: a keyring owned by another user, in a 0777 directory or behind a
    symlink was loaded (its mode bits were the only check); so was another user's key."""
    keys, ring = _keys(tmp_path, "ci")
    keys_dir = tmp_path / "keys"
    os.chmod(ring, 0o644)
    import shutil

    shutil.copy(ring, keys_dir / "trusted")
    os.chmod(keys_dir / "trusted", 0o644)
    expected = {
        "another user's file": "owned by",
        "a 0777 directory": "writable by group and others",
        "a 0777 grandparent": "writable by group and others",
        "a symlink": "is a symlink",
    }
    for load, name, variable in (
        (signing.load_keyring, "trusted", "CUFORGE_TRUSTED_KEYS"),
        (signing.load_signing_key, "ci.key", "CUFORGE_SIGNING_KEY"),
    ):
        assert load(str(keys_dir / name)) is not None  # the original is fine
        (tmp_path / f"case-{name}").mkdir()
        for case, path in _trusted_file_cases(tmp_path / f"case-{name}", keys_dir, name).items():
            with pytest.raises(ValueError) as err:
                load(path)
            text = str(err.value)
            assert variable in text and "cannot be trusted" in text, (case, text)
            assert expected[case] in text, (case, text)
    # a sticky world-writable directory owned by root (/tmp) is fine, as for ssh
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    shutil.copy(ring, sticky / "trusted")
    os.chmod(sticky / "trusted", 0o644)
    assert len(signing.load_keyring(str(sticky / "trusted"))) == 1
    # a keyring owned by root (a system one in /etc) is trusted by every user; a
    # group-writable one is not
    os.chmod(sticky / "trusted", 0o664)
    with pytest.raises(ValueError, match="writable by group"):
        signing.load_keyring(str(sticky / "trusted"))
