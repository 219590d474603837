"""``cuforge.Options``: typed compile options, accepted wherever a raw option list is.

::

    opts = cuforge.Options(std="c++17", fast_math=True, max_registers=64)
    cuforge.compile(src, options=opts)           # same key as the raw list below
    cuforge.compile(src, options=["-std=c++17", "--use_fast_math", "--maxrregcount=64"])

An ``Options`` *is* a sequence of option strings (iterating it yields the raw list), so it
goes through every ``options=`` argument of cuforge unchanged -- :func:`cuforge.compile`,
:func:`cuforge.jit`, the torch build -- and the cache key records exactly the raw list it
spells. Guaranteed: ``Options(...)`` gives the same key as :meth:`Options.as_list` passed as a
raw list, for NVRTC and nvcc alike (both compilers accept the one spelling used here:
``-std=c++17``, ``--use_fast_math``, ``-lineinfo``, ``-G``, ``--maxrregcount=N``,
``-rdc=true``, checked with CUDA 13.0). The order is fixed: the fields in the order they are
declared, then ``extra``. A raw list in another order or spelling (``-use_fast_math``) is a
different key, as it is a different command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Options", "STANDARDS"]

#: the C++ standards NVRTC and nvcc accept for ``-std=``
STANDARDS = ("c++03", "c++11", "c++14", "c++17", "c++20")


@dataclass(frozen=True, slots=True)
class Options(Sequence):
    """Typed compile options (a frozen dataclass).

    Fields:
        std: the C++ standard: ``"c++17"`` (also ``"17"`` or ``17``); None: the compiler's default.
        fast_math: ``--use_fast_math`` (fast, less exact math intrinsics; flush denormals).
        lineinfo: ``-lineinfo`` (source lines for profilers; no effect on the code).
        debug: ``-G`` (device debug info; turns optimizations off).
        max_registers: ``--maxrregcount=N``, registers per thread (1 to 255).
        rdc: ``-rdc=true``, relocatable device code (for linking with other device code).
        extra: raw options appended as they are (``("-DNDEBUG",)``).

    Immutable and hashable; values are checked (and ``std`` normalized) when it is made, so a
    bad value fails here with the field's name. ``list(opts)`` and :meth:`as_list` give the
    raw option list; ``dataclasses.replace(opts, debug=True)`` a changed copy.
    """

    std: str | int | None = None
    fast_math: bool = False
    lineinfo: bool = False
    debug: bool = False
    max_registers: int | None = None
    rdc: bool = False
    extra: Sequence[str] = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "std", _std(self.std))
        for name in ("fast_math", "lineinfo", "debug", "rdc"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(
                    f"Options({name}=...) must be True or False, not {type(value).__name__} {value!r}"
                )
        set_(self, "max_registers", _max_registers(self.max_registers))
        set_(self, "extra", _extra(self.extra))

    @property
    def _raw(self) -> tuple[str, ...]:
        return self._spell()

    def _spell(self) -> tuple[str, ...]:
        raw: list[str] = []
        if self.std is not None:
            raw.append(f"-std={self.std}")
        if self.fast_math:
            raw.append("--use_fast_math")
        if self.lineinfo:
            raw.append("-lineinfo")
        if self.debug:
            raw.append("-G")
        if self.max_registers is not None:
            raw.append(f"--maxrregcount={self.max_registers}")
        if self.rdc:
            raw.append("-rdc=true")
        raw.extend(self.extra)
        return tuple(raw)

    def as_list(self, backend: str = "nvrtc") -> list[str]:
        """The raw options for ``backend`` ("nvrtc" or "nvcc": the spelling is the same)."""
        if backend not in ("nvrtc", "nvcc"):
            raise ValueError(
                f"Options.as_list(backend=...) takes 'nvrtc' or 'nvcc', not {backend!r}"
            )
        return list(self._raw)

    # -- a sequence of strings ------------------------------------------------------------

    def __getitem__(self, index):
        return self._raw[index]

    def __len__(self) -> int:
        return len(self._raw)

    def __iter__(self):
        return iter(self._raw)

    def __add__(self, other) -> tuple[str, ...]:
        return self._raw + _extra(other)

    def __radd__(self, other) -> tuple[str, ...]:
        return _extra(other) + self._raw


def _std(value: str | int | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"Options(std=...) must be a string such as 'c++17', not {value!r}")
    text = str(value).strip().lower()
    if text.startswith("-std="):
        text = text[5:]
    if not text.startswith("c++"):
        text = "c++" + text
    if text not in STANDARDS:
        raise ValueError(f"Options(std={value!r}): expected one of {', '.join(STANDARDS)}")
    return text


def _max_registers(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Options(max_registers=...) must be an int, not {value!r}")
    if not 1 <= value <= 255:
        raise ValueError(f"Options(max_registers={value}): expected 1 to 255 registers per thread")
    return value


def _extra(value) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)):
        raise TypeError(
            f"Options(extra=...) must be a sequence of option strings, e.g. ('-DNDEBUG',), "
            f"not one string {value!r}"
        )
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(
            f"Options(extra=...) must be a sequence of option strings, not {type(value).__name__}"
        ) from None
    for item in items:
        if not isinstance(item, str):
            raise TypeError(
                f"Options(extra=...): every option must be a string, not {type(item).__name__} {item!r}"
            )
    return items
