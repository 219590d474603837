"""_fastjson.loads decodes exactly as json.loads, _fastjson.dumps encodes as compact
json.dumps (ASCII or not), and both refuse what json refuses."""

from __future__ import annotations

import json
import math
import random

import pytest

from cuforge.base._fastjson import dumps, loads

_ALPHABET = (
    "abcXYZ019 _-/\\\"'\t\n\r\b\f\x00\x1f\x7f"  # escapes and control characters
    "éßü中文한국어🙂\u2028\u2029\ufeff"  # non-ASCII, beyond the BMP, separators
)


def _string(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 12)))


def _number(rng: random.Random):
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randint(-(10**20), 10**20)  # beyond 64 bits
    if kind == 1:
        return rng.randint(-5, 5)
    if kind == 2:
        return rng.uniform(-1e6, 1e6)
    if kind == 3:
        return rng.choice([0.0, -0.0, 1e-300, -2.5e300, 5e-324, 1.7976931348623157e308])
    if kind == 4:
        return float(f"{rng.randint(1, 9)}.{rng.randint(0, 999)}e{rng.randint(-30, 30)}")
    return rng.random()


def _value(rng: random.Random, depth: int):
    kind = rng.randrange(8 if depth < 5 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return _number(rng)
    if kind in (3, 4):
        return _string(rng)
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {_string(rng): _value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def _dump(rng: random.Random, value) -> str:
    """A JSON text for ``value``, in varied but valid spellings."""
    text = json.dumps(
        value,
        ensure_ascii=rng.random() < 0.5,
        indent=rng.choice([None, 0, 2, "\t"]),
        separators=rng.choice([None, (",", ":"), (" , ", " : ")]),
        sort_keys=rng.random() < 0.5,
    )
    pad = rng.choice(["", " ", "\n", " \t\r\n "])
    return pad + text + pad


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_generated_documents_decode_as_json_does():
    rng = random.Random(20261123)
    for _ in range(3000):
        text = _dump(rng, _value(rng, 0))
        expected = json.loads(text)
        assert _same(loads(text), expected), text
        assert _same(loads(text.encode("utf-8")), expected), text


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, 2.5, -3e-7, 1E+2, -0, 0.0e0], "b": {"c": null, "d": true, "e": false}}',
        '"\\u00e9\\ud83d\\ude42 \\" \\\\ \\/ \\b\\f\\n\\r\\t"',
        '"\\ud800"',  # a lone surrogate escape: json keeps it, so must we
        "-12345678901234567890123",
        "1.5e999",  # overflows to inf in both
        "NaN",
        "[Infinity, -Infinity]",
        '{"dup": 1, "dup": 2}',  # the last one wins
        "  [ ]  ",
        "{}",
    ],
)
def test_edge_documents(text):
    assert _same(loads(text), json.loads(text))


MALFORMED = [
    "",
    "   ",
    "{",
    "[1, 2",
    "[1, 2,]",
    '{"a" 1}',
    '{"a": 1,}',
    "{'a': 1}",
    "01",
    "1.",
    ".5",
    "+1",
    "1e",
    "--1",
    "tru",
    "nul",
    "True",
    '"unterminated',
    '"bad escape \\x"',
    '"\\u12"',
    '"raw \n newline"',  # control characters must be escaped (strict)
    '"tab\there"',
    "[1] [2]",
    '{"a": 1} x',
    "1 2",
    "\ufeff{}",  # a byte order mark is not JSON
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_input_raises_value_error_like_json(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        loads(text)


def test_malformed_generated_documents_raise_value_error():
    rng = random.Random(7)
    for _ in range(2000):
        text = json.dumps(_value(rng, 0))
        cut = text[: rng.randrange(len(text))] if len(text) > 1 else "["
        try:
            expected = json.loads(cut)
        except ValueError:
            with pytest.raises(ValueError):
                loads(cut)
        else:
            assert _same(loads(cut), expected)


def test_invalid_utf8_bytes_raise_value_error():
    with pytest.raises(ValueError):
        json.loads(b'"\xff"')
    with pytest.raises(ValueError):
        loads(b'"\xff"')


def test_generated_values_encode_as_json_dumps_does():
    """``dumps`` (the telemetry line at a process's exit) writes what
    ``json.dumps(obj, separators=(",", ":"))`` writes, NaN and infinities included."""
    rng = random.Random(20261202)
    values = [_value(rng, 0) for _ in range(3000)]
    values += [float("nan"), [float("inf"), -float("inf")], {1: 2, 2.5: None, False: "x", None: []}]
    for value in values:
        assert dumps(value) == json.dumps(value, separators=(",", ":"))


def test_generated_values_encode_as_json_dumps_does_without_ensure_ascii():
    """``dumps(obj, ensure_ascii=False)`` (an entry file's metadata) writes what
    ``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)`` writes."""
    rng = random.Random(20261203)
    values = [_value(rng, 0) for _ in range(3000)]
    values += ["中文 \u2028 🙂", {"é": float("nan")}, {"k": "\x00\x1f\x7f\ud800"}]
    for value in values:
        want = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        assert dumps(value, ensure_ascii=False) == want


def test_dumps_refuses_what_json_dumps_refuses():
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        dumps(cycle)
    with pytest.raises(TypeError, match="Object of type set is not JSON serializable"):
        dumps({"a": {1, 2}})
    assert dumps([1, "after an error"]) == '[1,"after an error"]'  # no state is left behind
