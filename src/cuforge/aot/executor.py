"""Where build tasks run: the :class:`Executor` interface and the local process pool.

An executor takes :class:`~cuforge.aot.tasks.BuildTask` objects and yields one
:class:`~cuforge.aot.tasks.TaskResult` per task, in the order they finish. A failing task
yields ``ok=False`` with its log; it never stops the others. ``cuforge.aot.ray_executor``
(Ray) implements the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence

from cuforge.aot.tasks import BuildTask, TaskResult, run_task

__all__ = ["Executor", "LocalExecutor", "default_jobs"]


class Executor(ABC):
    """Runs build tasks somewhere. ``name``: shown in summaries (``"local"``, ``"ray"``)."""

    name: str = "?"

    @abstractmethod
    def run(self, tasks: Sequence[BuildTask], root: str) -> Iterator[TaskResult]:
        """Run every task with ``root`` (the manifest's dir) as the base of its relative
        paths; yield each result as it finishes. Exactly one result per task."""

    def close(self) -> None:  # noqa: B027 - an optional hook; most executors hold nothing
        """Release what the executor holds (workers, connections). Idempotent."""


def default_jobs() -> tuple[int, str]:
    """(jobs, why): the memory-aware job count ``cuforge env`` recommends (the same
    function, so the two never disagree)."""
    from cuforge.cli.env import recommended_jobs

    return recommended_jobs()


def _pool_context():
    """How pool workers start: ``fork`` where it is safe, else ``spawn``.

    A spawned worker starts Python, imports cuforge and loads NVRTC before its first result
    (0.45-0.65 s, measured on a free 16-core machine: longer than a whole 48-variant build
    of small kernels, which then cannot scale); a forked one starts with all of that done.
    Fork is used only on Linux, in a process with one thread (a fork copies locks other
    threads may hold) and no CUDA state (no CUDA library a fork could break is imported:
    cuforge's runtime, torch, CuPy, cuda.bindings' driver, cuda.core). Else spawn."""
    import multiprocessing
    import sys
    import threading

    cuda = ("cuforge.runtime.driver", "torch", "cupy", "cuda.bindings.driver", "cuda.core")
    if (
        sys.platform == "linux"
        and threading.active_count() == 1
        and not any(name in sys.modules for name in cuda)
    ):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


class LocalExecutor(Executor):
    """``jobs`` worker processes on this machine (forked where safe, else spawned: see
    :func:`_pool_context`). They share this process's environment and cache dir, so they
    read and write the driver's cache directly. ``jobs=1`` runs the tasks one after another
    in this process (no worker start-up cost)."""

    name = "local"

    def __init__(self, jobs: int = 1) -> None:
        if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
            raise ValueError(f"jobs must be a whole number >= 1, not {jobs!r}")
        self.jobs = jobs

    def run(self, tasks: Sequence[BuildTask], root: str) -> Iterator[TaskResult]:
        tasks = list(tasks)
        if not tasks:
            return
        if self.jobs == 1 or len(tasks) == 1:
            for task in tasks:
                yield run_task(task, root, collect=task.collect)
            return
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        workers = min(self.jobs, len(tasks))
        with ProcessPoolExecutor(workers, mp_context=_pool_context()) as pool:
            futures = {pool.submit(run_task, t, root, collect=t.collect): t for t in tasks}
            for future in as_completed(futures):
                task = futures[future]
                try:
                    result = future.result()
                except BrokenProcessPool as exc:
                    result = TaskResult(
                        task.label,
                        ok=False,
                        hit=False,
                        seconds=0.0,
                        log=f"the worker process died ({exc}); out of memory? try fewer --jobs",
                        task=task,
                    )
                except Exception as exc:  # noqa: BLE001 - one task's failure never hides the others
                    result = TaskResult(
                        task.label,
                        ok=False,
                        hit=False,
                        seconds=0.0,
                        log=f"{type(exc).__name__}: {exc}",
                        task=task,
                    )
                if result.task is None:
                    result.task = task
                yield result

    def __repr__(self) -> str:
        return f"LocalExecutor(jobs={self.jobs})"
