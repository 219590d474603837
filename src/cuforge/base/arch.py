"""GPU architectures: the one home for reading, numbering and spelling them.

Every arch cuforge handles passes through here:

* :func:`normalize_arch` reads any common spelling (``"sm_90"``, ``"9.0"``, ``"90"``, ``90``,
  ``"sm_90a"``, ``"compute_90"``) into the canonical ``sm_XY`` / ``compute_XY`` form;
* :func:`parse_arch_list` / :func:`parse_arch_entries` read a ``TORCH_CUDA_ARCH_LIST``-style
  list (``"8.0;9.0+PTX"``), the second keeping which entries asked for PTX;
* :func:`arch_number` orders archs; :func:`split_arch` takes one apart;
* :func:`gencode_flags` and :func:`nvcc_arch_flags` spell archs for nvcc;
  :func:`arch_to_torch` / :func:`torch_arch_list` spell them for torch;
* :func:`coverage` says whether an arch list has a kernel image for a GPU;
* :func:`arch_findings` says what is wrong with an arch-list variable on this machine
  (``cuforge env`` and ``cuforge doctor``).

The bottom layer: imports only :mod:`cuforge.base.errors`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cuforge.base.errors import ArchError

__all__ = [
    "ArchError",
    "normalize_arch",
    "parse_arch_list",
    "parse_arch_entries",
    "arch_number",
    "split_arch",
    "arch_to_torch",
    "torch_arch_list",
    "gencode_flags",
    "nvcc_arch_flags",
    "coverage",
    "arch_findings",
    "HOW_TO_SET",
]

#: How a user sets the arch; ends every "no arch" error.
HOW_TO_SET = (
    "Pass arch='sm_90' (or '9.0', '90') to compile(), or set CUFORGE_ARCH=sm_90 "
    "(TORCH_CUDA_ARCH_LIST='9.0' is read too)."
)


def normalize_arch(arch: str | int) -> str:
    """Any common spelling of an arch -> ``sm_XY`` (or ``compute_XY`` for a virtual arch).

    Accepts ``"sm_90"``, ``"sm_90a"``, ``"compute_90"``, ``"9.0"``, ``"90"``, ``90`` and
    ``"9.0a"``. ``"+PTX"`` suffixes are not accepted here; see :func:`parse_arch_list`.
    """
    text = str(arch).strip().lower()
    original = text
    prefix = "sm_"
    if text.startswith("sm_"):
        text = text[3:]
    elif text.startswith("sm"):
        text = text[2:]
    elif text.startswith("compute_"):
        prefix, text = "compute_", text[8:]
    suffix = ""
    if text and text[-1] in "af" and len(text) > 1:
        suffix, text = text[-1], text[:-1]
    if "." in text:
        major, _, minor = text.partition(".")
        digits = major + minor if major.isdigit() and minor.isdigit() and len(minor) == 1 else ""
    else:
        digits = text if text.isdigit() else ""
    if len(digits) not in (2, 3) or int(digits) < 30:
        raise ArchError(
            f"cannot read arch {original!r}: write it as 'sm_90', '9.0' or '90' "
            "(optionally with an 'a' suffix, e.g. 'sm_90a')"
        )
    return f"{prefix}{digits}{suffix}"


def parse_arch_entries(text: str) -> list[tuple[str, bool]]:
    """A ``TORCH_CUDA_ARCH_LIST``-style list (``"8.0;9.0+PTX"``, ``"8.0 9.0"``, ``"8.0,9.0"``)
    -> ``[(sm_XY, ptx), ...]`` in order, without repeats; ``ptx`` is True for an entry
    written with ``+PTX``. Raises :class:`ArchError` for an unreadable entry or no entry."""
    parts = [p for p in text.replace(",", ";").replace(" ", ";").split(";") if p.strip()]
    entries: dict[str, bool] = {}
    for part in parts:
        part = part.strip()
        ptx = part.upper().endswith("+PTX")
        if ptx:
            part = part[:-4]
        arch = normalize_arch(part)
        entries[arch] = entries.get(arch, False) or ptx
    if not entries:
        raise ArchError(f"arch list {text!r} names no arch")
    return list(entries.items())


def parse_arch_list(text: str) -> tuple[str, ...]:
    """A ``TORCH_CUDA_ARCH_LIST``-style list (``"8.0;9.0+PTX"``, ``"8.0 9.0"``) -> ``sm_XY``s."""
    return tuple(arch for arch, _ in parse_arch_entries(text))


def split_arch(arch: str | int) -> tuple[str, str]:
    """``"sm_90a"`` -> ``("sm", "90a")``; ``"compute_90"`` -> ``("compute", "90")``."""
    prefix, digits = normalize_arch(arch).split("_", 1)
    return prefix, digits


def arch_number(arch: str) -> tuple[int, str]:
    """Sort key of a normalized arch: ``"sm_90a"`` -> ``(90, "a")``."""
    digits = arch.split("_", 1)[-1]
    suffix = digits[-1] if digits and not digits[-1].isdigit() else ""
    return (int(digits[: len(digits) - len(suffix)]), suffix)


def arch_to_torch(arch: str) -> str:
    """``sm_90`` -> ``9.0``; ``sm_90a`` -> ``9.0a``; ``sm_100`` -> ``10.0``."""
    body = arch.split("_", 1)[-1]
    suffix = ""
    if body and body[-1].isalpha():
        body, suffix = body[:-1], body[-1]
    return f"{body[:-1]}.{body[-1]}{suffix}"


def torch_arch_list(archs: Iterable[str], *, ptx: bool = False) -> str:
    """``["sm_80", "sm_90"]`` -> ``"8.0;9.0"`` (``+PTX`` on the last one when ``ptx``)."""
    spelled = [arch_to_torch(a) for a in archs]
    if ptx and spelled:
        spelled[-1] += "+PTX"
    return ";".join(spelled)


def gencode_flags(archs: Iterable[str], *, ptx: bool = False) -> list[str]:
    """One ``-gencode=arch=compute_XY,code=sm_XY`` per arch, without repeats (a
    ``compute_XY`` arch gives ``code=compute_XY``: PTX), plus PTX of the last arch when
    ``ptx``."""
    flags: list[str] = []
    last = ""
    for arch in archs:
        prefix, digits = split_arch(arch)
        flag = f"-gencode=arch=compute_{digits},code={prefix}_{digits}"
        if flag not in flags:
            flags.append(flag)
        last = digits
    if ptx and last:
        flag = f"-gencode=arch=compute_{last},code=compute_{last}"
        if flag not in flags:
            flags.append(flag)
    return flags


def nvcc_arch_flags(archs: Sequence[str] | str | int, output: str) -> list[str]:
    """nvcc's arch flags for one compile: ``-arch=sm_XY`` for a cubin, ``-arch=compute_XY``
    for PTX, one ``-gencode`` per arch for a fatbin (``--threads 0`` with several).

    In ``archs``, ``sm_XY`` means SASS for that GPU and ``compute_XY`` PTX (only meaningful
    in a fatbin). Raises :class:`ArchError` for no arch, several for a cubin or PTX, or a
    virtual arch for a cubin."""
    if isinstance(archs, (str, int)):
        archs = (archs,)
    parsed = [split_arch(a) for a in archs]
    if not parsed:
        raise ArchError("no arch given: pass at least one, e.g. arch='sm_90'")
    if output in ("cubin", "ptx"):
        if len(parsed) != 1:
            names = ", ".join(f"{p}_{d}" for p, d in parsed)
            raise ArchError(
                f"output={output!r} is for one arch, but {len(parsed)} were given ({names}); "
                "use output='fatbin' to build for several"
            )
        prefix, digits = parsed[0]
        if output == "ptx":
            return [f"-arch=compute_{digits}"]
        if prefix == "compute":
            raise ArchError(
                f"a cubin needs a real arch such as 'sm_{digits}', not 'compute_{digits}'"
            )
        return [f"-arch=sm_{digits}"]
    flags = gencode_flags(f"{p}_{d}" for p, d in parsed)
    if len(flags) > 1:
        # 0 = as many threads as CPUs; a fixed spelling keeps the key machine-independent
        flags.extend(("--threads", "0"))
    return flags


def coverage(entries: Iterable[tuple[str, bool]], gpu: str) -> str | None:
    """How an arch list (``[(sm_XY, ptx), ...]``) serves a GPU: ``"exact"``,
    ``"compatible"`` (a same-major lower-minor cubin, or PTX of a lower arch JIT-compiled at
    load), or None (no kernel image for it)."""
    g_num, _ = arch_number(gpu)
    result = None
    for arch, ptx in entries:
        num, suffix = arch_number(arch)
        # an "a" (arch-specific) cubin runs on exactly its compute capability, so sm_90a
        # serves an sm_90 GPU; an "f" (family) cubin also runs on later minors of its major
        if num == g_num:
            return "exact"
        if suffix in ("", "f") and num // 10 == g_num // 10 and num < g_num:
            result = "compatible"
        if ptx and not suffix and num < g_num:
            result = "compatible"
    return result


def arch_findings(
    name: str, text: str, gpu_archs: list[str], supported: list[str]
) -> list[tuple[str, str, str | None]]:
    """Problems of an arch-list variable, as (status, message, fix) with status "FAIL" or
    "WARN"; [] when it is fine. ``name``: ``TORCH_CUDA_ARCH_LIST`` or ``CUFORGE_ARCH``;
    ``gpu_archs``: the visible GPUs' archs; ``supported``: what the toolkit builds ([] =
    unknown)."""
    suggestion = ";".join(arch_to_torch(a) for a in gpu_archs) or "9.0"
    fix_value = suggestion if name == "TORCH_CUDA_ARCH_LIST" else (gpu_archs or ["sm_90"])[0]
    fix = f"export {name}='{fix_value}'" + ("" if gpu_archs else "  (your target GPU's arch)")
    try:
        ptx = dict(parse_arch_entries(text))  # arch -> whether it asked for +PTX
    except ArchError as exc:
        return [("FAIL", f"{name}={text!r} cannot be read: {exc}", fix)]
    archs = list(ptx)
    found: list[tuple[str, str, str | None]] = []
    if name == "CUFORGE_ARCH" and gpu_archs:
        # compile() targets a visible GPU first: CUFORGE_ARCH only matters without one.
        if gpu_archs[0] not in archs:
            found.append(
                (
                    "WARN",
                    f"{name}={text!r} is ignored while a GPU is visible: compile() targets "
                    f"the GPU's {gpu_archs[0]}",
                    f"unset {name}  (or pass arch= to compile() to force another arch)",
                )
            )
        gpu_archs = []
    if supported:
        base = {a.rstrip("af") for a in supported}
        unknown = [a for a in archs if a.replace("compute_", "sm_").rstrip("af") not in base]
        if unknown:
            lo, hi = min(supported, key=arch_number), max(supported, key=arch_number)
            found.append(
                (
                    "FAIL",
                    f"{name}={text!r}: the CUDA toolkit cannot build {', '.join(unknown)} "
                    f"(it builds {lo} .. {hi})",
                    fix,
                )
            )
    for gpu in gpu_archs:
        how = coverage(list(ptx.items()), gpu)
        if how is None:
            found.append(
                (
                    "FAIL",
                    f"{name}={text!r} has no arch for the visible {gpu} GPU: its kernels "
                    "would fail with 'no kernel image is available'",
                    fix,
                )
            )
        elif how == "compatible":
            found.append(
                (
                    "WARN",
                    f"{name}={text!r} serves the visible {gpu} GPU only through "
                    "compatibility (an older cubin or PTX JIT at load): not tuned for it",
                    fix,
                )
            )
    if gpu_archs and not found:  # all GPUs served: is anything built for nothing?
        extra = [a for a in archs if all(coverage([(a, ptx[a])], g) is None for g in gpu_archs)]
        if extra:
            found.append(
                (
                    "WARN",
                    f"{name}={text!r} also builds {', '.join(extra)}, which no visible GPU "
                    "has: slower builds for nothing here",
                    fix,
                )
            )
    if len(archs) > 4:
        found.append(
            (
                "WARN",
                f"{name}={text!r} names {len(archs)} archs: every extension TU is compiled "
                f"{len(archs)} times (slow builds)",
                fix,
            )
        )
    return found
