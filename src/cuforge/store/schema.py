"""What a well-formed cache entry looks like: the shape of each kind's metadata.

A checksum proves that the bytes are the ones written; it does not prove that whoever
wrote them wrote something sensible (a planted entry, an old or buggy writer, an
imported bundle). Every entry is therefore checked against this schema when it is read
(:meth:`DiskStore.get`), verified (``cuforge cache verify``) and imported
(``cuforge cache import``); an entry that fails is *corrupt*: it is never served, it is
deleted and rebuilt, ``verify`` reports it and ``verify --repair`` removes it.

The rules (a field marked *typed* may be absent, but when present must have that type):

* every kind: ``meta`` is a JSON object with string keys; ``name`` (str), ``arch`` (str),
  ``backend`` (str), ``output`` (str), ``log`` (str), ``signer`` and ``signer_kid`` (str:
  the name and key id of the key that verified an entry a remote or bundle delivered),
  ``compile_seconds`` (a finite number >= 0, not a bool), ``lowered_names`` (object of
  str -> str), ``key_fields`` (object), ``header_paths`` (list of str) are *typed*.
* ``"kernel"``: the above (the pipeline writes all of them).
* ``"manifest"`` (the shared format of :mod:`cuforge.core.direct_mode`): ``variants``
  (*typed*): a list of variant objects, each with ``headers`` (object of str -> str),
  ``probes`` (list of str) and ``for`` (a non-empty str), all required, and ``digest``
  (str, *typed*); other keys of a variant are allowed (forward compatibility). The old
  pipeline format, ``headers`` / ``probes`` / ``for`` at the top level of ``meta``, is
  accepted with the same types (*typed*). The payload is not checked (the format writes
  ``b""``; manifests of the older torch build kept JSON there and have no ``variants``).
* ``"object"``, ``"module"`` (the torch build): the common rules only.
* ``"cccl"`` (:mod:`cuforge.cccl`, a serialized cuda.compute algorithm) and ``"cute"``
  (:mod:`cuforge.cute`, an exported CuTe DSL function): the common rules only.
* ``"triton"`` (:mod:`cuforge.triton`, one Triton kernel group packed as named files):
  the common rules, plus ``files`` (*typed*, an object of file name -> size) and a
  non-empty ``name`` (the kernel's name, required).
* ``"inductor"`` (:mod:`cuforge.torch.compile_cache`, one value of Inductor's FX-graph
  or autotune remote cache): the common rules, plus ``cache`` (required, a str naming
  Inductor's cache).
* ``"inductor-cpp"`` (:mod:`cuforge.torch.inductor_cpp`, one linked C++ kernel module of
  Inductor's CPU backend): the common rules; native host code.
* ``"cuda-core"`` (:mod:`cuforge.cuda_core`, a cuda.core program), ``"jax"``
  (:mod:`cuforge.jax`, a serialized JAX executable), ``"cupy"`` (:mod:`cuforge.cupy`, a
  CuPy kernel binary): the common rules, and ``output`` (*typed*) is the name of a binary
  format (:data:`_ADAPTER_OUTPUTS`).
* ``"flashinfer"`` (:mod:`cuforge.flashinfer`, one FlashInfer JIT module's ``.so``): the
  rules of ``"triton"`` (``files`` *typed*, a non-empty ``name``), and ``native_module``
  must be true.
* any other kind is corrupt.

**Native host code** (:func:`is_native`, the one definition): entries whose bytes the
process links and loads (``dlopen``), i.e. code that runs as the process's user on the host:
every ``"object"`` and ``"module"`` entry (the torch build's translation units and
extension modules; :mod:`cuforge.torch.opshim`'s op shim is one such module) and a
every ``"flashinfer"`` entry (a FlashInfer module), and a
``"triton"`` entry whose ``meta.native_module`` is true (a C module Triton builds:
``cuda_utils``, its launchers). A remote tier with no signature check refuses them
(:class:`cuforge.store.remote.tier.RemoteStore`, ``CUFORGE_REMOTE_NATIVE``), and a
loader of native code takes only an entry that says it is native (a native entry that
hid the flag would otherwise pass that refusal).

Imports nothing at load time.
"""

from __future__ import annotations

from cuforge.store.base import ENTRY_KINDS

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: see docs/architecture.md, the warm path
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any

__all__ = ["KINDS", "NATIVE_KINDS", "entry_problem", "is_native"]

#: Every kind an entry may have: the one list, ``cuforge.store.base.ENTRY_KINDS``.
KINDS = ENTRY_KINDS

#: the kinds whose every entry is native host code (see the module doc, :func:`is_native`)
NATIVE_KINDS = ("object", "module", "inductor-cpp", "flashinfer")


def is_native(kind: str, meta: Any) -> bool:
    """Whether an entry of ``kind`` with ``meta`` is native host code the process loads:
    an ``object`` or ``module`` entry, or a ``triton`` entry whose ``meta.native_module``
    is true (module doc)."""
    if kind in NATIVE_KINDS:
        return True
    return kind == "triton" and isinstance(meta, dict) and bool(meta.get("native_module"))


_STR_FIELDS = ("name", "arch", "backend", "output", "log", "signer", "signer_kid")


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_seconds(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == value  # not NaN
        and 0 <= value < float("inf")
    )


def _variant_problem(variant: Any, where: str) -> str | None:
    if not isinstance(variant, dict):
        return f"{where} is not an object"
    if not _is_str_map(variant.get("headers")):
        return f"{where}.headers is not an object of str -> str"
    if not _is_str_list(variant.get("probes")):
        return f"{where}.probes is not a list of str"
    target = variant.get("for")
    if not isinstance(target, str) or not target:
        return f"{where}.for is not a non-empty str"
    if "digest" in variant and not isinstance(variant["digest"], str):
        return f"{where}.digest is not a str"
    return None


def _triton_problem(meta: dict) -> str | None:
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return "meta.name is not a non-empty str (a triton entry names its kernel)"
    files = meta.get("files")
    if files is not None and not (
        isinstance(files, dict)
        and all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in files.items())
    ):
        return "meta.files is not an object of file name -> size"
    return None


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


#: field -> (check, what it must be); one dict lookup per meta field (this runs on every
#: disk hit)
_CHECKS = {
    **{field: (_is_str, "a str") for field in _STR_FIELDS},
    "compile_seconds": (_is_seconds, "a number >= 0"),
    "lowered_names": (_is_str_map, "an object of str -> str"),
    "key_fields": (_is_dict, "an object"),
    "header_paths": (_is_str_list, "a list of str"),
}


#: what ``meta.output`` of an adapter entry may say, per kind
_ADAPTER_OUTPUTS = {
    "cuda-core": ("cubin", "ptx", "ltoir", "fatbin", "object", "library"),
    "jax": ("executable",),
    "cupy": ("cubin", "ptx", "fatbin"),
}


def entry_problem(kind: Any, meta: Any) -> str | None:
    """Why an entry of ``kind`` with ``meta`` is malformed, or None when it is well formed.
    The message names the field (it ends up in warnings and ``verify`` reports)."""
    if kind not in KINDS:
        return f"unknown kind {kind!r}"
    if not isinstance(meta, dict):
        return "meta is not a JSON object"
    checks = _CHECKS
    for field, value in meta.items():
        rule = checks.get(field)
        if rule is None:
            if not isinstance(field, str):
                return f"meta has a non-string key {field!r}"
        elif not rule[0](value):
            shown = repr(value) if len(repr(value)) <= 60 else type(value).__name__
            return f"meta.{field} is {shown}, not {rule[1]}"
    if kind == "triton" or kind == "flashinfer":
        why = _triton_problem(meta)
        if why is not None:
            return why.replace("a triton entry names its kernel", f"a {kind} entry names it")
        if kind == "flashinfer" and meta.get("native_module") is not True:
            return "meta.native_module is not true (a flashinfer entry is a native module)"
    elif kind == "inductor" and not isinstance(meta.get("cache"), str):
        return "meta.cache is not a str (an inductor entry names its Inductor cache)"
    if kind == "manifest":
        if "variants" in meta:
            variants = meta["variants"]
            if not isinstance(variants, list):
                return "meta.variants is not a list"
            for i, variant in enumerate(variants):
                why = _variant_problem(variant, f"meta.variants[{i}]")
                if why is not None:
                    return why
        if "headers" in meta and not _is_str_map(meta["headers"]):
            return "meta.headers is not an object of str -> str"
        if "probes" in meta and not _is_str_list(meta["probes"]):
            return "meta.probes is not a list of str"
        if "for" in meta and not isinstance(meta["for"], str):
            return "meta.for is not a str"
    outputs = _ADAPTER_OUTPUTS.get(kind)
    if outputs is not None and "output" in meta and meta["output"] not in outputs:
        return (
            f"meta.output of a {kind} entry is {meta['output']!r}, not one of {', '.join(outputs)}"
        )
    return None
