"""How many compile jobs to run at once: min(cores, available memory / per-job estimate).

A translation unit that includes torch's headers takes 1-2.5 GB in cicc or cc1plus; a
build that runs one per core on a small-memory machine gets OOM-killed. ``MAX_JOBS``
(torch's variable) overrides the count.

The one home of that rule: :func:`job_count` (what a build runs, ``MAX_JOBS`` first) and
:func:`recommended_jobs` (what ``cuforge env`` / ``cuforge doctor`` recommend and
``cuforge build`` runs by default, whatever ``MAX_JOBS`` says now) both count through
:func:`jobs_for`; :func:`machine_resources` is the machine they count for.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "cpu_count",
    "available_memory",
    "machine_resources",
    "jobs_for",
    "job_count",
    "recommended_jobs",
    "TORCH_TU_BYTES",
]

#: memory estimate of one compile of a TU that includes torch's headers
TORCH_TU_BYTES = int(2.5 * 1024**3)


def cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (bytes), capped by a cgroup v2 memory limit."""
    avail = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        avail = None
    try:
        with open("/sys/fs/cgroup/memory.max", "rb") as f:
            raw = f.read().strip()
        if raw and raw != b"max":
            limit = int(raw)
            with open("/sys/fs/cgroup/memory.current", "rb") as f:
                used = int(f.read().strip())
            room = max(0, limit - used)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def machine_resources() -> dict[str, Any]:
    """``{"cores", "memory_available"}`` as the builds see them (CPU affinity;
    MemAvailable capped by a cgroup memory limit)."""
    return {"cores": cpu_count(), "memory_available": available_memory()}


def jobs_for(cores: int, memory: int | None, per_job_bytes: int = TORCH_TU_BYTES) -> int:
    """The rule: ``min(cores, memory // per_job_bytes)``, at least 1; ``cores`` when the
    available memory is unknown."""
    if not memory:
        return max(1, cores)
    return max(1, min(cores, memory // max(1, per_job_bytes)))


def _gib(n: float) -> str:
    return f"{n / 1024**3:.1f} GiB"


def job_count(per_job_bytes: int = TORCH_TU_BYTES) -> tuple[int, str]:
    """(jobs, why) for a build -- ``MAX_JOBS`` when set, else :func:`jobs_for` this
    machine. ``why`` is the one line verbose mode prints."""
    cores = cpu_count()
    env = os.environ.get("MAX_JOBS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), f"jobs={env} (MAX_JOBS; {cores} cores)"
    mem = available_memory()
    jobs = jobs_for(cores, mem, per_job_bytes)
    if mem is None:
        return jobs, f"jobs={jobs} ({cores} cores; available memory unknown)"
    return jobs, (
        f"jobs={jobs} = min({cores} cores, {_gib(mem)} available / {_gib(per_job_bytes)} per job)"
    )


def recommended_jobs(resources: dict[str, Any] | None = None) -> tuple[int, str]:
    """(parallel build jobs, why) for this machine (or ``resources``, as
    :func:`machine_resources` gives them), whatever ``MAX_JOBS`` says now: the cores,
    capped so that every job's torch-TU memory fits in the available memory -- the rule
    the builds follow when ``MAX_JOBS`` is unset."""
    res = resources or machine_resources()
    cores, available = res["cores"], res["memory_available"]
    jobs = jobs_for(cores, available)
    if not available:
        return jobs, f"{cores} cores (available memory unknown)"
    by_memory = max(1, available // TORCH_TU_BYTES)
    why = (
        f"min({cores} cores, {_gib(available)} available / "
        f"{_gib(TORCH_TU_BYTES)} per compile job = {by_memory})"
    )
    return jobs, why
