"""Keys: labeled, length-prefixed, schema-versioned; diff_fields explains the difference."""

from __future__ import annotations

from cuforge.keys import key as keymod
from cuforge.keys.key import KeyBuilder, diff_fields


def _key(**fields) -> str:
    kb = KeyBuilder("kernel")
    for label, value in fields.items():
        if isinstance(value, list):
            kb.items(label, value)
        elif isinstance(value, dict):
            kb.mapping(label, value)
        else:
            kb.text(label, value)
    return kb.hexdigest()


def test_same_fields_same_key_and_any_change_differs():
    assert _key(a="x", b=["1", "2"]) == _key(a="x", b=["1", "2"])
    assert _key(a="x", b=["1", "2"]) != _key(a="x", b=["2", "1"])
    assert _key(a="x") != _key(a="y")
    assert _key(a="x") != _key(b="x")


def test_length_prefixes_make_the_encoding_unambiguous():
    assert _key(a="ab", b="c") != _key(a="a", b="bc")
    assert _key(o=["-DA", "B"]) != _key(o=["-DAB"])
    assert _key(o=["a b"]) != _key(o=["a", "b"])


def test_maps_are_order_independent():
    assert _key(h={"a": "1", "b": "2"}) == _key(h={"b": "2", "a": "1"})


def test_kind_and_schema_version_separate_key_spaces(monkeypatch):
    a = KeyBuilder("kernel").text("x", "1").hexdigest()
    b = KeyBuilder("object").text("x", "1").hexdigest()
    assert a != b
    monkeypatch.setattr(keymod, "SCHEMA_VERSION", keymod.SCHEMA_VERSION + 1)
    assert KeyBuilder("kernel").text("x", "1").hexdigest() != a


def test_environment_field_tracks_allow_listed_vars_only(monkeypatch):
    monkeypatch.delenv("NVCC_APPEND_FLAGS", raising=False)
    base = KeyBuilder("k").environment().hexdigest()
    monkeypatch.setenv("SOMETHING_ELSE", "1")
    assert KeyBuilder("k").environment().hexdigest() == base
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-lineinfo")
    assert KeyBuilder("k").environment().hexdigest() != base


def test_copy_extends_independently():
    base = KeyBuilder("k").text("a", "1")
    one = base.copy().text("b", "2")
    assert base.hexdigest() != one.hexdigest()
    assert "b" not in base.fields


def test_diff_fields_reasons():
    old = {
        "arch": "sm_80",
        "options": ["-lineinfo"],
        "headers": {"/p/include/common.cuh": "aa", "/p/x.cuh": "bb"},
        "env": {"NVCC_APPEND_FLAGS": ""},
        "source": "sha256:1",
    }
    new = {
        "arch": "sm_90",
        "options": ["-lineinfo", "-DTILE=32"],
        "headers": {"/p/include/common.cuh": "cc", "/p/y.cuh": "dd"},
        "env": {"NVCC_APPEND_FLAGS": "-G"},
        "source": "sha256:2",
    }
    reasons = diff_fields(old, new)
    assert "arch sm_80 -> sm_90" in reasons
    assert "option -DTILE=32 added" in reasons
    assert "header /p/include/common.cuh changed" in reasons
    assert "header /p/x.cuh removed" in reasons and "header /p/y.cuh added" in reasons
    assert "env NVCC_APPEND_FLAGS='' -> '-G'" in reasons
    assert "source changed" in reasons
    assert diff_fields(old, old) == []
