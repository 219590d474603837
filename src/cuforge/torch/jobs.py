"""How many compile jobs to run at once: min(cores, available memory / per-job estimate).

A translation unit that includes torch's headers takes 1-2.5 GB in cicc or cc1plus; a
build that runs one per core on a small-memory machine gets OOM-killed. ``MAX_JOBS``
(torch's variable) overrides the count.
"""

from __future__ import annotations

import os

__all__ = ["cpu_count", "available_memory", "job_count", "TORCH_TU_BYTES"]

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


def job_count(per_job_bytes: int = TORCH_TU_BYTES) -> tuple[int, str]:
    """(jobs, why) -- ``why`` is the one line verbose mode prints."""
    cores = cpu_count()
    env = os.environ.get("MAX_JOBS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), f"jobs={env} (MAX_JOBS; {cores} cores)"
    mem = available_memory()
    if mem is None:
        return cores, f"jobs={cores} ({cores} cores; available memory unknown)"
    by_mem = max(1, mem // max(1, per_job_bytes))
    jobs = max(1, min(cores, by_mem))
    return jobs, (
        f"jobs={jobs} = min({cores} cores, {mem / 1024**3:.1f} GiB available / "
        f"{per_job_bytes / 1024**3:.1f} GiB per job)"
    )
