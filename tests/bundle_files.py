"""Bundles written by hand, in the format of :mod:`cuforge.store.bundle`, the way a hostile
or buggy writer would (``write_bundle_file`` refuses malformed rows; they do not)."""

from __future__ import annotations

import hashlib
import json
import struct

from cuforge.store.bundle import FORMAT_VERSION, MAGIC


def raw_bundle(path, rows: list[dict], body: bytes, info=None, index: bytes | None = None) -> None:
    """Write a bundle at ``path``: ``body`` is the payload area; each row (key, kind, meta,
    anything else) gives ``at`` (its offset into ``body``) and ``size``, and gets the right
    ``offset`` and ``sha256``; ``info`` goes into the index as is (default ``{}``).
    ``index``: these index bytes instead (their checksum is right)."""
    entries = []
    for row in rows:
        row = dict(row)
        at, size = row.pop("at"), row["size"]
        sha = hashlib.sha256(body[at : at + size]).hexdigest()
        entries.append({**row, "offset": 96 + at, "sha256": sha})
    if index is None:
        doc = {"format": FORMAT_VERSION, "info": {} if info is None else info, "entries": entries}
        index = json.dumps(doc).encode()
    head = struct.pack(
        "<8sIIQQ32s",
        MAGIC,
        FORMAT_VERSION,
        0,
        96 + len(body),
        len(index),
        hashlib.sha256(index).digest(),
    )
    with open(path, "wb") as f:
        f.write(head + hashlib.sha256(head).digest() + body + index)
