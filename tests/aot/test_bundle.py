"""Issue 13, section 3: bundles -- one versioned, checksummed file; installed into a fresh
cache dir, or served in place by ``cuforge.load_bundle``; a damaged one is refused with
an error naming the file."""

from __future__ import annotations

import json
import os
import struct

import pytest

from tests.aot.conftest import cli, jit_calls, variant_calls

ALL = variant_calls((128, 256), ("float", "double"), ("sm_80", "sm_90"))


@pytest.fixture
def bundle(project, tmp_path):
    """The issue's 8 variants, built into the test's cache and written as a bundle."""
    path = tmp_path / "app.cfb"
    done = cli(project, "build", "--jobs", "2", "--bundle", str(path), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["bundle"] == str(path) and report["bundle_entries"] == 16  # 8 kernels + manifests
    return path


def fresh_cache(tmp_path, name: str) -> str:
    return str(tmp_path / name)


def test_bundle_index_says_variants_archs_version_and_toolchain(project, bundle):
    import cuforge

    done = cli(project, "bundle", "ls", str(bundle), "--verify", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    info = out["info"]
    assert info["cuforge_version"] == cuforge.__version__
    assert info["archs"] == ["sm_80", "sm_90"]
    assert len(info["variants"]) == 8 and "red.cu  blk<128, float>  sm_90" in info["variants"]
    assert info["toolchain"]["nvrtc"]
    assert out["verified"] is True
    kernels = [e for e in out["entries"] if e["kind"] == "kernel"]
    assert len(kernels) == 8
    assert {e["arch"] for e in kernels} == {"sm_80", "sm_90"}
    text = cli(project, "bundle", "ls", str(bundle))
    assert text.returncode == 0 and "blk<256, double>" in text.stdout


def test_round_trip_into_a_fresh_cache_dir(project, bundle, tmp_path):
    cache = fresh_cache(tmp_path, "other-cache")
    done = cli(project, "bundle", "install", str(bundle), CUFORGE_CACHE_DIR=cache)
    assert done.returncode == 0, done.stderr
    assert "installed 16 new, 0 already present, of 16 entries" in done.stdout
    out = jit_calls(project, ALL, CUFORGE_CACHE_DIR=cache)
    assert out["errors"] == [] and out["counters"]["compiles"] == 0
    assert out["sources"] == ["disk"] * 8


def test_load_bundle_serves_in_place_without_copying(project, bundle, tmp_path):
    cache = fresh_cache(tmp_path, "empty-cache")
    out = jit_calls(project, ALL, CUFORGE_CACHE_DIR=cache, BUNDLE=str(bundle), CUFORGE_OFFLINE="1")
    assert out["errors"] == [] and out["counters"]["compiles"] == 0
    assert out["sources"] == ["bundle"] * 8
    assert out["counters"]["bundle_hits"] == 8
    # nothing was copied into the cache dir
    entries = os.path.join(cache, "v1", "entries")
    assert not os.path.isdir(entries) or not any(files for _, _, files in os.walk(entries))
    # each lookup the bundle answered is one hit of tier "bundle", never a miss (issue 36)
    done = cli(project, "cache", "stats", "--json", CUFORGE_CACHE_DIR=cache)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["tiers"].get("bundle", {}).get("hits") == 8, (stats["tiers"], stats["lookups"])
    assert (stats["lookups"]["hits"], stats["lookups"]["misses"]) == (8, 0), stats["lookups"]


def test_strict_mode_with_a_bundle_names_the_missing_variant(project, bundle, tmp_path):
    missing = [dict(ALL[0], name_expressions=["blk<512, float>"], defines={"TILE": "512"})]
    out = jit_calls(
        project,
        ALL[:1] + missing,
        CUFORGE_CACHE_DIR=fresh_cache(tmp_path, "c"),
        BUNDLE=str(bundle),
        CUFORGE_OFFLINE="1",
    )
    assert out["sources"] == ["bundle"] and out["counters"]["compiles"] == 0
    (error,) = out["errors"]
    assert error.startswith("OfflineMissError: strict mode: red.cu for sm_80")
    assert "blk<512, float>" in error and "TILE=512" in error
    assert str(bundle) in error  # which bundles were asked
    assert 'name_expressions = ["blk<512, float>"]' in error  # the entry to add
    assert "cuforge build --bundle" in error


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ("payload", "fails its SHA-256 check"),
        ("index", "index checksum"),
        ("header", "header checksum"),
        ("magic", "magic"),
        ("truncate", "does not end the file"),
        ("version", "format version 7"),
    ],
)
def test_a_damaged_bundle_is_a_clear_error_naming_the_file(project, bundle, damage, words):
    from cuforge.aot.bundle import load_bundle
    from cuforge.store.bundle import BundleError

    size = bundle.stat().st_size
    if damage == "payload":
        _flip(bundle, 96 + 10)
    elif damage == "index":
        _flip(bundle, size - 5)
    elif damage == "header":
        _flip(bundle, 20)
    elif damage == "magic":
        _flip(bundle, 0)
    elif damage == "truncate":
        bundle.write_bytes(bundle.read_bytes()[:-100])
    else:  # a future format version (with a matching header checksum)
        import hashlib

        data = bytearray(bundle.read_bytes())
        data[8:12] = struct.pack("<I", 7)
        data[64:96] = hashlib.sha256(bytes(data[:64])).digest()
        bundle.write_bytes(bytes(data))
    with pytest.raises(BundleError) as info:
        load_bundle(bundle)
    assert str(bundle) in str(info.value) and words in str(info.value)
    # install refuses it too, and installs nothing
    done = cli(project, "bundle", "install", str(bundle), "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["kind"] == "BundleError"


def test_verify_false_checks_each_entry_when_first_served(project, bundle):
    from cuforge.aot.bundle import load_bundle
    from cuforge.store.bundle import BundleError

    _flip(bundle, 96 + 10)  # inside the first payload
    b = load_bundle(bundle, verify=False)
    first = next(iter(b.iterate()))
    with pytest.raises(BundleError, match="fails its SHA-256 check"):
        b.get(first.key)


def test_loading_twice_returns_the_same_tier_and_unload_stops_serving(project, bundle):
    import cuforge
    from cuforge.aot.bundle import load_bundle, unload_bundle

    a = load_bundle(bundle)
    assert load_bundle(str(bundle)) is a
    assert cuforge.default_cache().bundles == (a,)
    assert a.put(next(a.entries())) is False and a.delete("0" * 64) is False  # read-only
    assert unload_bundle(a) and cuforge.default_cache().bundles == ()


def test_bundle_is_not_written_when_a_variant_fails(project, tmp_path):
    (project / "cuforge.toml").write_text(
        'arch = "sm_90"\n[[kernel]]\nsource = "red.cu"\ninclude_dirs = ["include"]\n'
        'name_expressions = ["blk<{B}, {T}>"]\ndefines = { TILE = "1" }\n'
        '[kernel.grid]\nB = [32]\nT = ["float", "nope_t"]\n'
    )
    out = tmp_path / "partial.cfb"
    done = cli(project, "build", "--jobs", "1", "--bundle", str(out))
    assert done.returncode == 1
    assert not out.exists()
    assert "not written" in done.stderr
