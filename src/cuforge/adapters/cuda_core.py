"""cuforge under cuda.core's program cache (``pip install "cuforge[cuda-core]"``).

Two ways in, both storing entries of kind ``"cuda-core"`` in a :class:`cuforge.Cache`
(every tier: memory, disk with its one LRU cap, the remotes, signed when signing is on;
listed by ``cuforge cache ls --kind cuda-core``):

* :class:`ProgramCache` -- a ``cuda.core.utils.ProgramCacheResource`` to pass as
  ``Program.compile(target, cache=ProgramCache())``. cuda.core derives the key
  (``make_program_cache_key``); cuforge stores the bytes. cuda.core's own rules apply:
  it refuses ``name_expressions`` and options that read files (``include_path``...) with
  ``cache=``, and a header the source includes from the working directory is outside its
  key.
* :func:`compile` -- ``compile(code, "c++", options=..., target_type="cubin",
  name_expressions=...)`` returns the same :class:`cuda.core.ObjectCode` that
  ``Program(code, code_type, options).compile(...)`` does, cached. cuforge knows more
  than cuda.core's key: the user headers the source includes (found by cuforge's
  dependency scanner where NVRTC looks: the working directory, ``include_path``,
  ``pre_include``) enter the key by *content* through cuda.core's own ``extra_digest``,
  so a header edit misses and a ``touch`` hits; and ``symbol_mapping`` (name expressions
  -> lowered names) is stored with the binary, so ``get_kernel("add<float>")`` works on a
  hit.

``enable()``: cuda.core has no process-wide default program cache (``Program`` is a
compiled class whose ``compile`` takes ``cache=`` per call, and a ``Program`` does not
expose its source or options), so there is nothing to switch on globally; :func:`enable`
says so. Pass ``cache=ProgramCache()`` or call :func:`compile`.

A damaged entry (bytes that do not unpack, a bad symbol mapping) is deleted and the
program compiled again; it is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING

from cuda.core import ObjectCode, Program, ProgramOptions
from cuda.core.utils import ProgramCacheResource, make_program_cache_key

from cuforge.adapters.common import damaged, read_files, write_files
from cuforge.core import blobcache
from cuforge.core.caching import Cache, resolve
from cuforge.keys.deps import file_digest, scan_includes
from cuforge.toolchain.installed import SITE_DIR_NAMES

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["KIND", "ProgramCache", "compile", "compile_result", "header_digest", "enable"]

KIND = "cuda-core"
#: cuda.core versions whose ProgramCacheResource / make_program_cache_key this module
#: was written against (checked by tests/adapters/cuda_core/test_contract.py)
SUPPORTED = ((1, 2),)

_CODE = "code"
_SYMBOLS = "symbol_mapping.json"
_FROM = {"cubin": "from_cubin", "ptx": "from_ptx", "ltoir": "from_ltoir"}
# options whose effect depends on files cuforge does not fingerprint (PCH)
_PCH_OPTIONS = ("pch", "use_pch", "pch_dir", "create_pch")


def _own_coercions() -> tuple[Any, Any]:
    """cuda.core's own key and value coercions (``_as_key_bytes``, ``_extract_bytes``), so
    that code written for ``FileStreamProgramCache`` / ``InMemoryProgramCache`` gets the same
    errors and messages from :class:`ProgramCache` (a path-backed ``ObjectCode`` whose file
    is gone: ``FileNotFoundError``; a value of another type: ``TypeError``). Private in
    cuda.core 1.2: where they are missing, the same checks with the same messages."""
    try:
        from cuda.core.utils._program_cache._abc import _as_key_bytes, _extract_bytes
    except ImportError:
        return _as_key_bytes_here, _extract_bytes_here
    return _as_key_bytes, _extract_bytes


def _as_key_bytes_here(key: object) -> bytes:
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    if isinstance(key, str):
        return key.encode("utf-8")
    raise TypeError(f"cache keys must be bytes or str, got {type(key).__name__}")


def _extract_bytes_here(value: object) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, ObjectCode):
        code = value.code
        if isinstance(code, str):  # a path-backed ObjectCode: store the bytes, not the path
            try:
                with open(code, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"cannot store path-backed ObjectCode in cache: {code} no longer exists"
                ) from None
        return bytes(code)
    raise TypeError(f"cache values must be bytes-like or ObjectCode, got {type(value).__name__}")


_as_key_bytes, _value_bytes = _own_coercions()


class ProgramCache(ProgramCacheResource):
    """A ``cuda.core.utils.ProgramCacheResource`` backed by a :class:`cuforge.Cache`
    (``cache``; default: :func:`cuforge.default_cache` at each call).

    Keys are cuda.core's (``make_program_cache_key``); each is stored under a cuforge key
    derived from it, as an entry of kind ``"cuda-core"``. ``len()`` and ``clear()`` see
    the ``"cuda-core"`` entries of the local tiers (a remote is never listed or wiped).
    A stored entry that does not unpack is deleted and reported as missing, so
    ``Program.compile`` compiles again."""

    def __init__(self, cache: Cache | None = None, *, max_size_bytes: int | None = None) -> None:
        if cache is not None:
            resolve(cache)  # a wrong argument is named now
        if max_size_bytes is not None and (
            isinstance(max_size_bytes, bool) or not isinstance(max_size_bytes, int)
        ):
            raise TypeError(
                f"max_size_bytes must be an int or None, not {type(max_size_bytes).__name__}"
            )
        if max_size_bytes is not None and max_size_bytes <= 0:  # cuda.core's own rule and text
            raise ValueError("max_size_bytes must be positive or None (0 would evict every write)")
        self._cache = cache
        #: a cap on this cache's ``cuda-core`` entries (the oldest used go first), as
        #: cuda.core's ``FileStreamProgramCache(max_size_bytes=N)``; the cuforge cache's
        #: own cap (``max_bytes``) still holds for everything
        self.max_size_bytes = max_size_bytes

    @property
    def cache(self) -> Cache:
        return resolve(self._cache)

    @staticmethod
    def entry_key(key: bytes | str) -> str:
        """The cuforge key of cuda.core's ``key``."""
        return blobcache.make_key(KIND, {"cuda_core_key": _as_key_bytes(key).hex()})[0]

    def __getitem__(self, key: bytes | str) -> bytes:
        cache = self.cache
        ckey = self.entry_key(key)
        files = read_files(cache, ckey, KIND, "cuda-core program")
        if files is None:
            raise KeyError(key)
        data = files.get(_CODE)
        if data is None:
            damaged(cache, ckey, KIND, "cuda-core program", KeyError(_CODE))
            raise KeyError(key)
        return data

    def __setitem__(self, key: bytes | str, value: Any) -> None:
        data = _value_bytes(value)
        ckey = self.entry_key(key)
        # "bytes": the value's own size, which max_size_bytes counts (as cuda.core does)
        meta: dict[str, Any] = {"name": "program", "backend": KIND, "bytes": len(data)}
        if isinstance(value, ObjectCode):
            meta["name"] = value.name or "program"
            meta["output"] = str(value.code_type)
        cache = self.cache
        write_files(cache, ckey, KIND, {_CODE: data}, meta)
        if self.max_size_bytes is not None:
            self._evict_to_cap(cache)

    def _evict_to_cap(self, cache: Cache) -> None:
        """Delete the least recently used ``cuda-core`` entries of the local tiers until
        they fit :attr:`max_size_bytes` (a write larger than the cap does not survive its
        own pass, as in cuda.core's caches)."""
        infos = sorted(
            (i for i in cache.iterate() if i.kind == KIND), key=lambda i: (i.last_used, i.created)
        )
        sizes = [int(i.meta.get("bytes", i.size)) for i in infos]
        total = sum(sizes)
        for info, size in zip(infos, sizes, strict=True):
            if total <= self.max_size_bytes:
                break
            if cache.delete(info.key):
                total -= size

    def __delitem__(self, key: bytes | str) -> None:
        if not self.cache.delete(self.entry_key(key)):
            raise KeyError(key)

    def __len__(self) -> int:
        return sum(1 for info in self.cache.iterate() if info.kind == KIND)

    def clear(self) -> None:
        cache = self.cache
        for key in [info.key for info in cache.iterate() if info.kind == KIND]:
            cache.delete(key)


def _listed(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    return [os.fspath(v) for v in value]


#: files that name the release of a system header root (CCCL, the CUDA runtime headers):
#: such a root is identified by these files' contents, not hashed file by file
_VERSION_FILES = (
    "cuda/std/__cccl/version.h",
    "cub/version.cuh",
    "thrust/version.h",
    "cuda_runtime_api.h",
)
#: path parts of an installed Python package (a header wheel: cuda-cccl, nvidia-*)
_PACKAGE_PARTS = SITE_DIR_NAMES
#: header_digest's per-process memo: (code, where NVRTC looks) -> a scan still to re-check
_SCAN_MEMO_MAX = 256
_scan_memo: dict[tuple, _Scanned] = {}


class _Scanned:
    """One :func:`header_digest` result and what it depends on: the user headers' digests,
    the paths whose appearance would change an include's resolution, and the version
    files of the system roots."""

    __slots__ = ("digests", "probes", "result")

    def __init__(self, digests: dict[str, str], probes: list[str], result: bytes) -> None:
        self.digests, self.probes, self.result = digests, probes, result

    def holds(self) -> bool:
        """True when re-scanning would give the same digest: every file has the digest it
        had (one ``stat`` each while unchanged) and no probe exists now."""
        for path, digest in self.digests.items():
            if file_digest(path) != digest:
                return False
        return not any(os.path.lexists(p) for p in self.probes)


def _system_identity(directory: str, toolkit: Sequence[str]) -> dict[str, str] | None:
    """``{version file: path}`` of ``directory`` when it is a *system* header root: inside
    the CUDA toolkit (:func:`cuforge.toolchain.locate.toolkit_include_dirs`, the toolkit
    root) or inside an installed Python package (``site-packages``), and holding at least
    one of :data:`_VERSION_FILES`. Headers under it are then identified by those files
    (their releases), not hashed one by one -- the kernel pipeline's rule for the toolkit.
    None: a user directory (every header read from it is hashed)."""
    real = os.path.realpath(directory)  # /usr/local/cuda/include -> /usr/local/cuda-13.0/...
    parts = real.split(os.sep)
    inside = any(part in _PACKAGE_PARTS for part in parts) or any(
        real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in toolkit
    )
    if not inside:
        return None
    found = {}
    for name in _VERSION_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            found[name] = path
    return found or None


def header_digest(
    code: str, options: ProgramOptions, *, cwd: str | None = None
) -> tuple[bytes | None, str | None]:
    """``(extra_digest, None)``: the digest of the user headers ``code`` includes, where
    NVRTC looks for them (the directory of ``options.name`` -- the working directory for a
    name without one --, then ``options.include_path``; ``options.pre_include`` first),
    by content: paths do not enter it, so the same headers in another checkout hit.
    An include directory of the CUDA toolkit or of an installed package (CCCL's headers,
    ``nvidia-*`` header wheels) that holds a release's version file is a *system* root:
    its headers are not followed or hashed, its version files' contents enter the digest
    instead. ``(None, reason)`` when the compile cannot be keyed.

    Memoized per process: a repeat re-checks each user header with one ``stat`` and each
    path that would change an include's resolution with one ``lstat``."""
    for opt in _PCH_OPTIONS:
        if getattr(options, opt, None):
            return (
                None,
                f"ProgramOptions.{opt} reads a precompiled header cuforge does not fingerprint",
            )
    base = cwd or os.getcwd()
    name_dir = os.path.dirname(options.name or "")
    source_dir = os.path.join(base, name_dir) if name_dir else base
    include_dirs = [os.path.join(base, d) for d in _listed(options.include_path)]
    pre_includes = _listed(getattr(options, "pre_include", None))
    memo_key = (code, source_dir, tuple(include_dirs), tuple(pre_includes), base)
    known = _scan_memo.get(memo_key)
    if known is not None and known.holds():
        return known.result, None
    toolkit: list[str] = []
    if include_dirs:
        from cuforge.toolchain.locate import toolkit_include_dirs, toolkit_root

        root = toolkit_root()
        toolkit = [*toolkit_include_dirs(), *([root] if root else [])]
    user_dirs, system_dirs, identities = [], [], []
    for i, d in enumerate(include_dirs):
        ident = _system_identity(d, toolkit)
        if ident is None:
            user_dirs.append(d)
        else:
            system_dirs.append(d)
            identities.append((i, ident))
    scan = scan_includes(
        code,
        source_dir=source_dir,
        include_dirs=user_dirs,
        system_dirs=system_dirs,
        pre_includes=pre_includes,
    )
    if scan.uncacheable:
        return None, scan.uncacheable
    h = hashlib.sha256(b"cuforge-cuda-core-headers\0")
    depends: dict[str, str] = {}
    digests = []
    for path in scan.headers:
        digest = file_digest(path)
        if digest is None:
            return None, f"the header {path} cannot be read"
        digests.append(digest)
        depends[path] = digest
    for digest in sorted(digests):
        h.update(digest.encode() + b"\n")
    h.update(b"unresolved\0" + "\0".join(sorted(scan.unresolved)).encode())
    for i, ident in identities:
        # the position in include_path and the release, not the path: another checkout or
        # virtualenv with the same releases hits
        for name, path in ident.items():
            digest = file_digest(path)
            if digest is None:
                return None, f"the header {path} cannot be read"
            depends[path] = digest
            h.update(f"system\0{i}\0{name}\0{digest}\n".encode())
    result = h.digest()
    if len(_scan_memo) >= _SCAN_MEMO_MAX:
        _scan_memo.clear()
    _scan_memo[memo_key] = _Scanned(depends, list(scan.probes), result)
    return result, None


def _load(target_type: str, name: str):
    def load(files: dict[str, bytes]) -> ObjectCode:
        mapping = json.loads(files[_SYMBOLS].decode("utf-8"))
        if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()
        ):
            raise ValueError("the stored symbol mapping is not an object of str -> str")
        factory = getattr(ObjectCode, _FROM[target_type])
        return factory(
            files[_CODE], name=name, symbol_mapping={k: v.encode() for k, v in mapping.items()}
        )

    return load


def compile_result(
    code: str,
    code_type: str = "c++",
    *,
    options: ProgramOptions | None = None,
    target_type: str = "cubin",
    name_expressions: Sequence[str] = (),
    logs: Any = None,
    cache: Cache | None = None,
) -> blobcache.BlobResult[ObjectCode]:
    """:func:`compile`, returning the :class:`cuforge.core.blobcache.BlobResult` (``.value`` is
    the ObjectCode; ``.source_of_result`` says ``"disk"``, ``"remote"``, ``"compiled"``...)."""
    if not isinstance(code, str):
        raise TypeError(f"code must be the source text (str), got {type(code).__name__}")
    if target_type not in _FROM:
        raise ValueError(f"target_type must be one of {', '.join(_FROM)}, got {target_type!r}")
    names = tuple(name_expressions)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(
                f"name_expressions must be str (cuforge stores symbol_mapping by str), got {n!r}"
            )
    if options is None:
        options = ProgramOptions()
    extra, why = (None, None)
    if code_type == "c++":
        extra, why = header_digest(code, options)
    uncacheable = why
    try:
        ckey = make_program_cache_key(
            code=code,
            code_type=code_type,
            options=options,
            target_type=target_type,
            name_expressions=names,
            extra_digest=extra,
        )
        fields = {"cuda_core_key": ckey.hex()}
    except ValueError as exc:
        uncacheable = uncacheable or f"cuda.core cannot key it ({exc})"
        fields = {"code": hashlib.sha256(code.encode()).hexdigest()}
    name = options.name or "program"

    def build() -> dict[str, bytes]:
        obj = Program(code, code_type, options).compile(target_type, names, logs)
        mapping = {
            k: v.decode() if isinstance(v, bytes) else str(v)
            for k, v in (obj.symbol_mapping or {}).items()
        }
        return {_CODE: _value_bytes(obj), _SYMBOLS: json.dumps(mapping).encode()}

    return blobcache.get_or_build(
        KIND,
        name,
        fields,
        build,
        _load(target_type, name),
        uncacheable=uncacheable,
        meta={"output": target_type, "arch": str(options.arch or "")},
        cache=cache,
    )


def compile(code: str, code_type: str = "c++", **kwargs: Any) -> ObjectCode:
    """``Program(code, code_type, options).compile(target_type, name_expressions, logs)``,
    cached in ``cache`` (default :func:`cuforge.default_cache`) with the user headers'
    contents in the key and ``symbol_mapping`` kept; the keywords of
    :func:`compile_result`. A compile cuforge cannot key (PCH options, a computed include
    it cannot follow) runs every time, with a warning once. ``logs`` receives nothing on a
    hit."""
    return compile_result(code, code_type, **kwargs).value


def enable(cache: Cache | None = None) -> None:
    """cuda.core has no process-wide program cache to plug into: raises with what to do."""
    raise NotImplementedError(
        "cuda.core has no global default program cache (Program.compile takes cache= per "
        "call): pass cache=cuforge.cuda_core.ProgramCache() to Program.compile, or call "
        "cuforge.cuda_core.compile(code, 'c++', options=..., name_expressions=...)"
    )
