"""Which GPU archs a compile targets: explicit, else the visible GPU, else ``CUFORGE_ARCH``,
else ``TORCH_CUDA_ARCH_LIST``, else a clear error. Spelling and numbering archs is
:mod:`cuforge.base.arch`'s job; this module only decides where the archs come from."""

from __future__ import annotations

from cuforge.base.arch import HOW_TO_SET, ArchError, arch_number, normalize_arch, parse_arch_list
from cuforge.base.config import settings
from cuforge.toolchain import gpu

__all__ = ["resolve_archs"]


def _explicit_archs(arch: object) -> tuple[str, ...]:
    if isinstance(arch, (str, int)):
        text = str(arch)
        if any(sep in text for sep in ";, "):
            return parse_arch_list(text.strip())
        return (normalize_arch(text),)
    try:
        items = list(arch)  # type: ignore[call-overload]
    except TypeError:
        raise ArchError(f"cannot read arch {arch!r}: {HOW_TO_SET}") from None
    archs: list[str] = []
    for item in items:
        if not isinstance(item, (str, int)):
            raise ArchError(f"cannot read arch {item!r}: {HOW_TO_SET}")
        for one in _explicit_archs(item):
            if one not in archs:
                archs.append(one)
    if not archs:
        raise ArchError(f"an empty arch list was given. {HOW_TO_SET}")
    return tuple(archs)


def resolve_archs(arch: object, *, allow_many: bool) -> tuple[str, ...]:
    """The archs to compile for, normalized (``sm_90``, ``sm_90a``, ``compute_90``).

    ``arch``: None, a string (``"sm_90"``, ``"9.0"``, ``"90"``, ``"sm_90a"``, or a list
    such as ``"8.0;9.0"``), an int (``90``) or a sequence of those. When None: the first
    visible GPU's arch; else ``CUFORGE_ARCH``; else ``TORCH_CUDA_ARCH_LIST``; else
    :class:`~cuforge.base.errors.ArchError` saying how to set it. With ``allow_many`` False an
    explicit list of several is an error, and a list from the environment gives its
    highest arch.
    """
    if arch is not None:
        archs = _explicit_archs(arch)
        if len(archs) > 1 and not allow_many:
            raise ArchError(
                f"arch={arch!r} names {len(archs)} archs, but this compile targets one "
                "(NVRTC, or output 'cubin'/'ptx'). Pass one arch, or use backend='nvcc' "
                "with output='fatbin' for several."
            )
        return archs
    gpus = gpu.visible_gpu_archs()
    if gpus:
        return (gpus[0],)
    current = settings()
    for var, value in (
        ("CUFORGE_ARCH", current.arch),
        ("TORCH_CUDA_ARCH_LIST", current.torch_arch_list),
    ):
        if not value:
            continue
        try:
            archs = parse_arch_list(value)
        except ArchError as exc:
            raise ArchError(f"{var}={value!r}: {exc}. {HOW_TO_SET}") from None
        if len(archs) > 1 and not allow_many:
            return (max(archs, key=arch_number),)
        return archs
    raise ArchError(
        "no GPU arch to compile for: no GPU is visible and neither CUFORGE_ARCH nor "
        f"TORCH_CUDA_ARCH_LIST is set. {HOW_TO_SET}"
    )
