"""``cuforge doctor``: the setup checklist, made executable.

Every check prints PASS, WARN or FAIL with a one-line fix; SKIP marks a check that could
not run here (no GPU, no torch) and says why. The exit code is 1 when any check FAILs.
``--json`` gives a stable document (``"schema": 1``)::

    {"schema": 1, "command": "doctor", "ok": bool,
     "summary": {"pass": n, "warn": n, "fail": n, "skip": n},
     "gpus": [{"index", "name", "arch", "memory_bytes"}], "no_gpu_reason": str | null,
     "skipped": ["gpu.arch", ...],
     "checks": [{"id", "title", "status", "detail", "fix", "data"}, ...]}

Check ids: ninja, gpu, gpu.arch, gpu.driver, arch_list (arch_list.TORCH_CUDA_ARCH_LIST,
arch_list.CUFORGE_ARCH when set; arch_list.agreement when both are set: WARN when they name
different archs, saying which wins where), build_jobs, ccache, sccache, nvrtc,
nvrtc.headers (NVRTC's version against the CUDA_VERSION of the headers it compiles with),
nvrtc.headers_compile (a real NVRTC compile of tiny kernels using cuda_fp16.h, cuda_bf16.h
and CUB, through the cache the doctor reports on, so a second doctor compiles nothing; FAIL
with the pip fix when one does not compile), nvcc, cuda_home (WARN when the CUDA_HOME torch
would use, as ``torch.utils.cpp_extension._find_cuda_home`` guesses it, lacks
include/cuda_runtime.h; the fix is the export), cuda_headers, torch, cache.dir, cache.size, cache.hits, cache.integrity, remote (one per
URL in CUFORGE_REMOTE), fast_launch. The doctor never raises: a check that breaks becomes a
WARN saying so.

``cuforge doctor --help`` lists the check ids. ``--check ID`` (repeatable) runs only the checks that make those rows, and reports only those
rows (an unknown id is a usage error that lists the ids); :func:`run_checks` does the same in
process and returns the rows.

The checks live by subject: :mod:`~cuforge.cli.doctor.toolchain` (ninja, NVRTC, headers,
nvcc, the toolkit, ccache/sccache), :mod:`~cuforge.cli.doctor.gpu` (GPUs, archs, jobs, the
launch path), :mod:`~cuforge.cli.doctor.torch`, :mod:`~cuforge.cli.doctor.cache` (the cache
dir and its trust), :mod:`~cuforge.cli.doctor.remote`; :mod:`~cuforge.cli.doctor.render` draws
the report. The machine facts they read live in the library (:mod:`cuforge.toolchain`,
:mod:`cuforge.torch.facts`, :mod:`cuforge.torch.jobs`, :mod:`cuforge.base.arch`).

``remote`` (:func:`cuforge.store.remote.sync.probe`): reachable (a get of a key that does
not exist answers a miss, not an error), latency (the median of a few such round trips,
``data.latency_ms``), writable (a put and a get of a small probe entry; not tried in
read-only mode), signing (whether CUFORGE_REMOTE_KEY / _KEY_FILE is set, and when it is,
that the probe entry came back through the signature check). FAIL when unreachable or a
write is refused; WARN when slower than the transfer timeout's tenth; SKIP when no remote
is configured.

``cache.dir`` FAILs when the cache dir does not exist and cannot be created (its nearest
existing ancestor is a file, or not writable: a probe file is really made there), and when
it, or a directory directly under it (``v1``, ``locks``, ...), fails
:func:`cuforge.base._fs.trust_problem` (not owned by you, or writable by group or others):
cuforge then reads nothing from it, and the fix (``chmod go-w ...`` or ``chown ...``) is
printed; the cache.size/hits/integrity checks are SKIPped.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from cuforge.adapters.windows import WINDOWS
from cuforge.cli import output
from cuforge.cli.doctor.adapters import check_adapters
from cuforge.cli.doctor.base import STATUSES, Check, Probe
from cuforge.cli.doctor.cache import check_bundle_wheels, check_cache
from cuforge.cli.doctor.gpu import (
    check_arch_agreement,
    check_arch_list,
    check_fast_launch,
    check_gpus,
    check_jobs,
)
from cuforge.cli.doctor.remote import check_remote
from cuforge.cli.doctor.render import TITLE_WIDTH, layout, render
from cuforge.cli.doctor.toolchain import (
    check_compiler_caches,
    check_cuda_headers,
    check_cuda_home,
    check_header_compiles,
    check_ninja,
    check_nvcc,
    check_nvrtc,
    check_nvrtc_headers,
)
from cuforge.cli.doctor.torch import check_torch

__all__ = [
    "add_parser",
    "run",
    "collect",
    "run_checks",
    "check_ids",
    "Check",
    "Probe",
    "STATUSES",
    "CHECKS",
    "ROW_IDS",
    "layout",
    "render",
]

#: In the order of the issue's checklist: build tools, GPUs, archs, parallelism, compiler
#: caches, the toolkit, torch, the cache, the remote cache.
CHECKS: tuple[tuple[str, Callable[[Probe], list[Check]]], ...] = (
    ("ninja", check_ninja),
    ("gpu", check_gpus),
    ("arch_list", check_arch_list),
    ("arch_list.agreement", check_arch_agreement),
    ("build_jobs", check_jobs),
    ("ccache", check_compiler_caches),
    ("nvrtc", check_nvrtc),
    ("nvrtc.headers", check_nvrtc_headers),
    ("nvrtc.headers_compile", check_header_compiles),
    ("nvcc", check_nvcc),
    ("cuda_home", check_cuda_home),
    ("cuda_headers", check_cuda_headers),
    ("torch", check_torch),
    ("cache", check_cache),
    ("bundle_wheels", check_bundle_wheels),
    ("remote", check_remote),
    ("fast_launch", check_fast_launch),
    ("adapters", check_adapters),
)

#: The row ids each check of :data:`CHECKS` can give, where they are not just its name.
ROW_IDS: dict[str, tuple[str, ...]] = {
    "gpu": ("gpu", "gpu.arch", "gpu.driver"),
    "arch_list": ("arch_list", "arch_list.TORCH_CUDA_ARCH_LIST", "arch_list.CUFORGE_ARCH"),
    "ccache": ("ccache", "sccache"),
    "cache": ("cache.dir", "cache.size", "cache.hits", "cache.integrity"),
    "adapters": tuple(f"adapters.{name}" for name in WINDOWS),
}


def check_ids() -> list[str]:
    """Every row id ``--check`` accepts, in report order."""
    return [row_id for name, _ in CHECKS for row_id in ROW_IDS.get(name, (name,))]


def _run_one(name: str, fn: Callable[[Probe], list[Check]], probe: Probe) -> list[Check]:
    """One check's rows; a check that breaks becomes a WARN saying so, never a crash."""
    try:
        return fn(probe)
    except Exception as exc:  # noqa: BLE001 - the doctor must finish its report
        return [
            Check(
                name,
                name,
                "WARN",
                f"could not run this check ({type(exc).__name__}: {exc})",
                "report this at the cuforge issue tracker with `cuforge doctor --json`",
            )
        ]


def collect() -> tuple[list[Check], Probe]:
    """Run every check. A check that breaks becomes a WARN saying so, never a crash."""
    probe = Probe()
    rows: list[Check] = []
    for name, fn in CHECKS:
        rows.extend(_run_one(name, fn, probe))
    return rows, probe


def _select(ids: Iterable[str], probe: Probe) -> list[Check]:
    wanted = list(dict.fromkeys(ids))
    known = check_ids()
    unknown = [i for i in wanted if i not in known]
    if unknown:
        raise output.UsageError(
            f"--check {', '.join(map(repr, unknown))}: no such check; the check ids are "
            + ", ".join(known)
        )
    rows: list[Check] = []
    for name, fn in CHECKS:
        if not any(i in wanted for i in ROW_IDS.get(name, (name,))):
            continue
        for row in _run_one(name, fn, probe):
            # a broken check's WARN carries the check's name: keep it, it is the answer
            if row.id in wanted or row.id == name:
                rows.append(row)
    return rows


def run_checks(ids: Iterable[str]) -> list[Check]:
    """The rows of the checks ``ids`` names (row ids, as in ``--check``; see
    :func:`check_ids`), run in this process: only the checks that make those rows run.
    Raises :class:`cuforge.cli.output.UsageError` (a ``ValueError``) naming the ids that
    exist when one is unknown. A row the situation does not call for (``arch_list.CUFORGE_ARCH``
    with the variable unset) is absent."""
    return _select(ids, Probe())


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        "doctor",
        parents=[common],
        help="check this machine's CUDA/torch build setup (PASS/WARN/FAIL with fixes)",
        description="Check ninja, the GPUs, the CUDA toolkit, NVRTC, torch, the arch "
        "settings, build parallelism, the cuforge cache and the remote caches. Exit code 1 "
        "when any check "
        "FAILs. Works without a GPU (GPU checks are SKIPped).",
        epilog="check ids (for --check): " + ", ".join(check_ids()),
    )
    p.add_argument(
        "--check",
        dest="checks",
        action="append",
        metavar="ID",
        help="run only this check (a row id such as nvrtc.headers or cache.dir; repeatable)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    selected = getattr(args, "checks", None)
    if selected:
        probe = Probe()
        rows = _select(selected, probe)
    else:
        rows, probe = collect()
    summary = {s.lower(): sum(1 for r in rows if r.status == s) for s in STATUSES}
    skipped = [r.id for r in rows if r.status == "SKIP"]
    failed = summary["fail"] > 0
    if args.json:
        gpus, why = probe.gpus()
        output.emit_json(
            {
                "command": "doctor",
                "ok": not failed,
                "summary": summary,
                "gpus": gpus,
                "no_gpu_reason": why,
                "skipped": skipped,
                "checks": [r.as_dict() for r in rows],
            }
        )
    else:
        render(rows, summary, skipped, TITLE_WIDTH if selected else None)
    return 1 if failed else 0
