"""The ``adapters`` rows: each installed peer against its adapter's tested window
(docs/compat.md). Inside the window: PASS, importing nothing. Outside it the adapter's
contract probe runs (importing that peer): passed is a WARN naming the untested version,
failed a WARN saying what is missing (the peer's own cache keeps working)."""

from __future__ import annotations

from importlib import metadata

from cuforge.adapters.common import shown, version_tuple
from cuforge.adapters.windows import WINDOWS
from cuforge.cli.doctor.base import Check, Probe, row_maker

#: system -> the module whose hook_problem() runs the probe
_MODULES = {
    "triton": "cuforge.adapters.triton",
    "torch_compile": "cuforge.torch.compile_cache",
    "jax": "cuforge.adapters.jax",
    "cupy": "cuforge.adapters.cupy",
}


def check_adapters(p: Probe) -> list[Check]:
    rows: list[Check] = []
    for system, (dist, peer, (low, high)) in WINDOWS.items():
        row = row_maker(f"adapters.{system}", f"{peer} adapter")
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            rows.append(row("SKIP", f"{peer} is not installed"))
            continue
        span = f"{shown(low)} to before {shown(high)}"
        parts = version_tuple(version, max(len(low), len(high)))
        if low <= parts < high:
            rows.append(row("PASS", f"{peer} {version}: a tested release ({span})"))
            continue
        import importlib

        try:
            problem = importlib.import_module(_MODULES[system]).hook_problem()
        except ImportError as exc:
            problem = f"{peer} {version} cannot be imported ({exc})"
        if problem is None:
            rows.append(
                row(
                    "WARN",
                    f"{peer} {version} is outside the tested releases ({span}); its contract "
                    "probe passed, so cuforge caches it (untested version)",
                    "report problems; cuforge's tested window is in docs/compat.md",
                )
            )
        else:
            rows.append(
                row(
                    "WARN",
                    problem,
                    f"use a {peer} release in {span}, or a cuforge that supports {version}",
                )
            )
    return rows
