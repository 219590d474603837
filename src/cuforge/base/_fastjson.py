"""``loads``: JSON decoding without importing :mod:`json`.

``import json`` pulls in :mod:`re` and compiles its patterns: ~10 ms on a small machine,
more than a whole warm cache hit. The C scanner behind ``json`` (``_json``) needs none of
that, so the hit path decodes metadata with it. Encoding (on the write path) uses
:mod:`json` itself.
"""

from __future__ import annotations

__all__ = ["loads"]


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
