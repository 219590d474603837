"""The direct-mode manifest format shared by the kernel pipeline and the torch build."""

from __future__ import annotations

import os

from cuforge.core import direct_mode
from cuforge.core.direct_mode import MAX_VARIANTS, Variant, match, read_variants, write_variant
from cuforge.keys.deps import file_digest, stat_signature
from cuforge.keys.key import KeyBuilder
from cuforge.store.base import Entry
from cuforge.store.disk import DiskStore
from cuforge.store.memory import MemoryStore


def _store() -> MemoryStore:
    return MemoryStore(1 << 20)


def _header(tmp_path, name: str, text: str) -> str:
    path = str(tmp_path / name)
    with open(path, "w") as f:
        f.write(text)
    return path


def _variant(path: str, target: str, probes=()) -> Variant:
    digest = file_digest(path)
    assert digest is not None
    return Variant({path: digest}, list(probes), target)


def test_manifest_key_is_the_pipeline_derivation():
    assert direct_mode.manifest_key("ab" * 32) == (
        KeyBuilder("manifest").text("base", "ab" * 32).hexdigest()
    )
    assert direct_mode.manifest_key("ab" * 32) != direct_mode.manifest_key("cd" * 32)


def test_round_trip_through_the_disk_store(tmp_path):
    store = DiskStore(str(tmp_path / "cache"), 1 << 24, telemetry=False)
    h = _header(tmp_path, "a.h", "int a;\n")
    key = direct_mode.manifest_key("00" * 32)
    variant = Variant({h: file_digest(h)}, [str(tmp_path / "absent.h")], "t1" * 32)
    write_variant(store, key, "kern.cu", variant)
    entry = DiskStore(str(tmp_path / "cache"), 1 << 24, telemetry=False).get(key)
    assert entry is not None and entry.kind == "manifest" and entry.payload == b""
    assert entry.meta["name"] == "kern.cu"
    assert entry.meta["variants"] == (
        [
            {
                "headers": {h: file_digest(h)},
                "probes": [str(tmp_path / "absent.h")],
                "for": "t1" * 32,
            }
        ]
    )
    assert read_variants(store, key) == [variant]


def test_newest_first_dedupe_and_cap(tmp_path):
    store = _store()
    h = _header(tmp_path, "a.h", "x")
    key = "k" * 64
    variants = [Variant({h: f"{i:064x}"}, [], f"target{i}") for i in range(MAX_VARIANTS + 3)]
    for v in variants:
        write_variant(store, key, "n", v)
    got = read_variants(store, key)
    assert len(got) == MAX_VARIANTS
    assert got == list(reversed(variants))[:MAX_VARIANTS]
    # writing an existing variant again moves it to the front, once
    write_variant(store, key, "n", variants[-3])
    got = read_variants(store, key)
    assert got[0] == variants[-3]
    assert got.count(variants[-3]) == 1
    assert len(got) == MAX_VARIANTS


def test_malformed_entries_read_as_no_manifest():
    store = _store()
    good = {"headers": {"/a.h": "0" * 64}, "probes": [], "for": "t" * 64}
    bad_metas = [
        {},
        {"variants": "nope"},
        {"variants": [good, 3]},
        {"variants": [{"headers": ["/a.h"], "probes": [], "for": "t"}]},
        {"variants": [{"headers": {"/a.h": 5}, "probes": [], "for": "t"}]},
        {"variants": [{"headers": {}, "probes": "p", "for": "t"}]},
        {"variants": [{"headers": {}, "probes": [1], "for": "t"}]},
        {"variants": [{"headers": {}, "probes": []}]},
        {"variants": [{"headers": {}, "probes": [], "for": ""}]},
        {"variants": [{"headers": {}, "probes": [], "for": "t", "digest": 7}]},
        # the pipeline's single-variant format of before: not this format
        {"name": "x", "headers": {"/a.h": "0" * 64}, "probes": [], "for": "t" * 64},
    ]
    for i, meta in enumerate(bad_metas):
        key = f"{i:064x}"
        store.put(Entry(key, "manifest", b"", meta))
        assert read_variants(store, key) == [], meta
    store.put(Entry("e" * 64, "kernel", b"", {"variants": [good]}))
    assert read_variants(store, "e" * 64) == []  # wrong kind
    assert read_variants(store, "f" * 64) == []  # absent
    assert read_variants(None, "f" * 64) == []  # no store
    # a malformed manifest is replaced by the next write, not an error
    write_variant(store, f"{0:064x}", "n", Variant({}, [], "t" * 64))
    assert read_variants(store, f"{0:064x}") == [Variant({}, [], "t" * 64)]


def test_the_optional_payload_digest_round_trips(tmp_path):
    store = _store()
    with_digest = Variant({}, [], "t" * 64, "d" * 64)
    write_variant(store, "k" * 64, "n", with_digest)
    assert store.get("k" * 64).meta["variants"][0]["digest"] == "d" * 64
    assert read_variants(store, "k" * 64) == [with_digest]
    # without one, the meta has no "digest" field (the pipeline's variants)
    write_variant(store, "j" * 64, "n", Variant({}, [], "t" * 64))
    assert "digest" not in store.get("j" * 64).meta["variants"][0]
    assert read_variants(store, "j" * 64)[0].digest == ""
    assert Variant({}, [], "t" * 64) != with_digest


def test_header_edit_misses_and_revert_hits(tmp_path):
    store = _store()
    h = _header(tmp_path, "a.h", "#define A 1\n")
    key = "m" * 64
    write_variant(store, key, "n", _variant(h, "first"))
    found = match(read_variants(store, key))
    assert found is not None
    variant, digests, sigs = found
    assert variant.target == "first"
    assert digests == {h: file_digest(h)}
    assert sigs == [(h, stat_signature(h))]

    _header(tmp_path, "a.h", "#define A 2\n")  # edit: the old variant no longer holds
    assert match(read_variants(store, key)) is None
    write_variant(store, key, "n", _variant(h, "second"))
    assert match(read_variants(store, key))[0].target == "second"

    _header(tmp_path, "a.h", "#define A 1\n")  # revert: the first variant holds again
    assert match(read_variants(store, key))[0].target == "first"

    os.unlink(h)  # a header that is gone never matches
    assert match(read_variants(store, key)) is None


def test_a_probe_path_appearing_misses(tmp_path):
    h = _header(tmp_path, "a.h", "x")
    probe = str(tmp_path / "inc" / "a.h")
    variants = [_variant(h, "target", probes=[probe])]
    assert match(variants) is not None
    os.makedirs(os.path.dirname(probe))
    _header(tmp_path, "inc/a.h", "y")
    assert match(variants) is None


def test_resolve_maps_placeholders_to_real_paths(tmp_path):
    h = _header(tmp_path, "a.h", "x")
    digest = file_digest(h)
    variant = Variant({"${SRC}/a.h": digest}, ["${SRC}/gone.h"], "target")

    def resolve(path: str) -> str:
        return str(tmp_path) + path[len("${SRC}") :] if path.startswith("${SRC}") else path

    found = match([variant], resolve)
    assert found is not None
    assert found[1] == {"${SRC}/a.h": digest}  # keyed by the recorded path
    assert [p for p, _ in found[2]] == [h]  # signatures of the real file
    assert match([variant]) is None  # unresolved, the placeholder path does not exist
