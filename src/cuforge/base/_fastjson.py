"""``loads`` and ``dumps``: JSON without importing :mod:`json`.

``import json`` pulls in :mod:`re` and compiles its patterns: ~7-10 ms on a small machine,
more than a whole warm cache hit. The C scanner and encoder behind ``json`` (``_json``)
need none of that, so the hit path decodes metadata with the one, and a process's exit
writes its telemetry line, and the disk tier an entry's metadata, with the other
(:func:`dumps`: what ``json.dumps(obj, separators=(",", ":"), ensure_ascii=...)`` gives,
through the same C encoder). Other encoding (indents, sorted keys) uses :mod:`json` itself.
"""

from __future__ import annotations

__all__ = ["loads", "dumps"]


def _make_loads():
    try:
        import _json
    except ImportError:  # pragma: no cover - a Python built without the accelerator
        import json

        return json.loads

    class _Context:
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {
            "NaN": float("nan"),
            "Infinity": float("inf"),
            "-Infinity": float("-inf"),
        }.__getitem__
        memo: dict = {}

    scan = _json.make_scanner(_Context())
    whitespace = " \t\n\r"

    def loads(text: str | bytes):
        """Decode one JSON document (surrounding whitespace allowed). ValueError if malformed."""
        if isinstance(text, (bytes, bytearray)):
            text = text.decode("utf-8")
        start = 0
        while start < len(text) and text[start] in whitespace:
            start += 1
        try:
            value, end = scan(text, start)
        except StopIteration:
            raise ValueError("not JSON") from None
        if text[end:].strip(whitespace):
            raise ValueError("trailing data after JSON")
        return value

    return loads


loads = _make_loads()


def _make_dumps():
    try:
        from _json import encode_basestring, encode_basestring_ascii, make_encoder
    except ImportError:  # pragma: no cover - a Python built without the accelerator
        make_encoder = None
    if make_encoder is not None:
        try:  # the arguments json.JSONEncoder.iterencode passes the C encoder (3.10-3.14)
            make_encoder({}, None, encode_basestring_ascii, None, ":", ",", False, False, True)
        except TypeError:  # pragma: no cover - another interpreter's C encoder
            make_encoder = None
    if make_encoder is None:  # pragma: no cover

        def dumps_json(obj, *, ensure_ascii: bool = True) -> str:
            import json

            return json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii)

        return dumps_json

    def default(obj):
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    def dumps(obj, *, ensure_ascii: bool = True) -> str:
        """``json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii)``: ASCII
        (or, with ``ensure_ascii=False``, non-ASCII characters as they are), NaN allowed, a
        circular structure refused (ValueError), a value JSON cannot hold refused
        (TypeError)."""
        strings = encode_basestring_ascii if ensure_ascii else encode_basestring
        encode = make_encoder({}, default, strings, None, ":", ",", False, False, True)
        return "".join(encode(obj, 0))

    return dumps


dumps = _make_dumps()
