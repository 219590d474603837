"""``cuforge build``: every variant of a manifest, built once, in parallel.

:func:`build` reads the manifest (:mod:`cuforge.aot.manifest`), asks the cache for each
kernel variant in this process first (a strict lookup: no compile), sends only the misses
to an executor (the local process pool, or Ray), stores the entries that executors hand
back, and, with ``bundle=``, writes every variant's entries into one bundle.

Guarantees:

* A variant already in the cache is a hit: it is not sent to any executor.
* One failing variant never stops the others; each failure keeps its compiler log.
* A bundle is written only when every variant succeeded (a partial bundle would fail
  later, in production): with failures, :attr:`BuildReport.bundle` stays None.
* ``strict=True``: nothing is compiled; every variant missing from the cache is a failure
  with the :class:`~cuforge.core.pipeline.OfflineMissError` text (a check that a cache or a
  bundle is complete). A ``python`` variant is checked by calling its function in this
  process with ``CUFORGE_OFFLINE=1``: any build it would make raises instead, and the
  traceback is the failure's log.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

from cuforge.aot.bundle import write_bundle
from cuforge.aot.executor import Executor, LocalExecutor, default_jobs
from cuforge.aot.manifest import Manifest, load_manifest, parse_manifest
from cuforge.aot.tasks import (
    BuildTask,
    TaskResult,
    is_cached,
    run_task,
    store_entries,
    task_entries,
)
from cuforge.base.errors import CuforgeError, OfflineMissError
from cuforge.core.caching import Cache, resolve
from cuforge.core.prefetch import LockReport
from cuforge.core.recording import lock_keys, read_lock
from cuforge.store.base import Entry

__all__ = ["build", "build_lock", "BuildReport", "make_executor"]


@dataclasses.dataclass
class BuildReport:
    """What :func:`build` did. ``results``: one per variant, manifest order."""

    manifest: str
    root: str
    executor: str
    jobs: int
    jobs_why: str
    results: list[TaskResult]
    seconds: float
    bundle: str | None = None
    bundle_bytes: int = 0
    bundle_entries: int = 0
    stored: int = 0

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def hits(self) -> int:
        return sum(1 for r in self.results if r.ok and r.hit)

    @property
    def built(self) -> int:
        return sum(1 for r in self.results if r.ok and not r.hit)

    @property
    def failed(self) -> list[TaskResult]:
        return [r for r in self.results if not r.ok]

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "executor": self.executor,
            "jobs": self.jobs,
            "total": self.total,
            "hits": self.hits,
            "built": self.built,
            "failed": len(self.failed),
            "seconds": round(self.seconds, 6),
            "variants_per_second": round(self.total / self.seconds, 3) if self.seconds else None,
            "bundle": self.bundle,
            "bundle_bytes": self.bundle_bytes,
            "bundle_entries": self.bundle_entries,
            "results": [
                {
                    "label": r.label,
                    "ok": r.ok,
                    "hit": r.hit,
                    "seconds": round(r.seconds, 6),
                    **({"log": r.log} if not r.ok else {}),
                }
                for r in self.results
            ],
        }


def make_executor(kind: str | Executor, jobs: int) -> Executor:
    """``"local"`` -> :class:`LocalExecutor` (``jobs`` processes); ``"ray"`` ->
    ``cuforge.aot.ray_executor.RayExecutor`` (imported only now; a clear error when it or
    ray is missing); an :class:`Executor` is used as it is."""
    if isinstance(kind, Executor):
        return kind
    if kind == "local":
        return LocalExecutor(jobs)
    if kind == "ray":
        try:
            from cuforge.aot.ray_executor import RayExecutor
        except ImportError as exc:
            raise CuforgeError(
                f"--executor ray needs Ray and cuforge's Ray executor, and importing them "
                f"failed ({exc}). Install the extra: pip install 'cuforge[ray]'; for a "
                "cluster, set RAY_ADDRESS (else a local Ray starts)"
            ) from None
        return RayExecutor(address=None)
    raise ValueError(f"executor must be 'local' or 'ray', not {kind!r}")


def build(
    manifest: str | Manifest | None = None,
    *,
    jobs: int | None = None,
    executor: str | Executor = "local",
    bundle: str | os.PathLike[str] | None = None,
    strict: bool = False,
    on_result: Callable[[TaskResult, int], None] | None = None,
    cache: Cache | None = None,
) -> BuildReport:
    """Build every variant of ``manifest`` (a path, a directory, or a read
    :class:`Manifest`; default: the working directory's). ``jobs``: worker processes for
    the local executor (default: the count ``cuforge env`` recommends). ``on_result(result,
    total)`` is called once per variant as it finishes (hits first). ``cache``: the
    :class:`cuforge.Cache` to build into (default: :func:`cuforge.default_cache`). Raises
    :class:`~cuforge.aot.manifest.ManifestError` for a bad manifest; a failing variant is
    reported in the result, never raised."""
    start = time.perf_counter()
    m = manifest if isinstance(manifest, Manifest) else load_manifest(manifest)
    if jobs is None:
        jobs, why = default_jobs()
        why = f"{jobs} (cuforge env: {why})"
    else:
        why = f"{jobs} (--jobs)"
    tasks = list(m.tasks)
    if bundle is not None:  # an extension's entries come back only from a collect run
        tasks = [dataclasses.replace(t, collect=True) if t.kind != "kernel" else t for t in tasks]
    total = len(tasks)
    done: dict[int, TaskResult] = {}
    misses: list[tuple[int, BuildTask]] = []

    stored = 0

    def finish(i: int, result: TaskResult) -> None:
        nonlocal stored
        done[i] = result
        if result.ok and result.entries:
            # stored as it arrives: the driver's writes overlap the compiles still running
            stored += store_entries([result], cache=cache)
        if on_result is not None:
            on_result(result, total)

    for i, task in enumerate(tasks):
        t0 = time.perf_counter()
        if is_cached(task, m.root, cache=cache):
            finish(i, TaskResult(task.label, True, True, time.perf_counter() - t0, "", task=task))
        else:
            misses.append((i, task))
    name = executor if isinstance(executor, str) else executor.name
    if strict:
        for i, task in misses:
            if task.kind == "python":
                finish(i, _strict_python(task, m.root, cache))
            else:
                finish(i, _strict_failure(task, m.root, cache))
    elif misses:
        runner = make_executor(executor, jobs)
        name = runner.name
        index = {id(t): i for i, t in misses}
        by_label = {t.label: i for i, t in misses}
        try:
            for result in runner.run([t for _, t in misses], m.root, cache):
                i = index.get(id(result.task), by_label.get(result.label))
                if i is None or i in done:
                    raise CuforgeError(
                        f"the {runner.name} executor returned a result for {result.label!r}, "
                        "which it was not given (or twice)"
                    )
                finish(i, result)
        finally:
            if runner is not executor:
                runner.close()
        lost = [t for i, t in misses if i not in done]
        for task in lost:
            i = by_label[task.label]
            finish(
                i, TaskResult.failed(task, f"the {runner.name} executor returned no result for it")
            )
    results = [done[i] for i in range(total)]
    if name == "ray" and misses:
        why = "the Ray cluster's CPUs (--jobs applies to the local executor)"
    report = BuildReport(m.path, m.root, name, jobs, why, results, 0.0)
    report.stored = stored
    if bundle is not None and report.ok:
        _write(report, m, tasks, os.fspath(bundle), cache)
    report.seconds = time.perf_counter() - start
    return report


def _strict_failure(task: BuildTask, root: str, cache: Cache | None) -> TaskResult:
    if task.kind != "kernel":
        log = (
            f"{task.label}: strict mode checks kernel variants only; an [[extension]] can be "
            "checked only by building it (run without --strict)"
        )
    else:
        try:
            task_entries(task, root, cache=cache)
            log = "it was built while this check ran; run the check again"
        except OfflineMissError as exc:
            log = str(exc)
        except (CuforgeError, OSError, ValueError) as exc:
            log = f"{type(exc).__name__}: {exc}"
    return TaskResult.failed(task, log)


def _strict_python(task: BuildTask, root: str, cache: Cache | None) -> TaskResult:
    """Call the variant's function against an offline copy of the cache: ok when every
    cuforge call it makes is served from the cache or a loaded bundle."""
    result = run_task(task, root, cache=cache, offline=True)
    if not result.ok:
        where = f"{task.manifest}:{task.line}" if task.manifest else "the manifest"
        result.log = (
            f"strict mode: {task.label} ([[python]] at {where}) needs a build that is not in "
            "the cache or a loaded bundle; nothing was built. Run `cuforge build` (without "
            "--strict) against this cache, or build and load a bundle of this manifest.\n"
            + result.log
        )
    return result


def _write(
    report: BuildReport, m: Manifest, tasks: list[BuildTask], path: str, cache: Cache | None
) -> None:
    entries: list[Entry] = []
    for task, result in zip(tasks, report.results, strict=True):
        if task.kind == "kernel":
            entries.extend(task_entries(task, m.root, cache=cache))
        else:
            entries.extend(Entry(k, kind, p, meta) for k, kind, p, meta in result.entries or ())
    report.bundle_bytes = write_bundle(
        path,
        entries,
        variants=[t.label for t in tasks],
        archs=m.archs,
        manifest=os.path.basename(m.path),
    )
    report.bundle = os.path.abspath(path)
    report.bundle_entries = len({e.key for e in entries})


def _find(cache: Cache, kind: str, key: str) -> Entry | None:
    if kind == "manifest":  # every tier's manifest: the variant may be in any of them
        for where in cache.chain:
            entry = where.get(key, kind="manifest")
            if entry is not None:
                return entry
        return None
    return cache.get(key, kind=kind)


def _kernel_manifest(entry: Entry, target: str) -> Entry:
    """The manifest entry holding only the variant that leads to ``target``."""
    variants = [v for v in entry.meta.get("variants", []) if v.get("for") == target]
    return Entry(entry.key, "manifest", b"", {**entry.meta, "variants": variants[:1] or []})


def _collect(cache: Cache, records: list[dict], entries: dict[str, Entry]) -> list[dict]:
    """Add every entry of ``records`` the cache has; returns the records still lacking."""
    lacking = []
    for r in records:
        if r["kind"] == "torch":
            lacking.append(r)
            continue
        found = []
        for kind, key, _name in lock_keys([r]):
            entry = _find(cache, kind, key)
            if entry is None:
                break
            found.append(_kernel_manifest(entry, r["key"]) if kind == "manifest" else entry)
        else:
            for entry in found:
                entries[entry.key] = entry
            continue
        lacking.append(r)
    return lacking


def build_lock(
    lock: str | os.PathLike[str],
    bundle: str | os.PathLike[str],
    *,
    jobs: int | None = None,
    executor: str = "local",
    cache: Cache | None = None,
    on_result: Callable[[Any, int], None] | None = None,
) -> LockReport:
    """``cuforge build --lock``: write ``bundle`` holding exactly the entries of ``lock``
    (a lockfile written by :func:`cuforge.record`). Every entry of the lock that the cache
    (any tier) has is copied into the bundle; a kernel or torch extension it lacks is built
    from its ``cuforge.toml`` stanza (through :func:`build`, in parallel, local or Ray);
    whatever is still missing is reported and no bundle is written (a partial warm set
    would fail in production)."""
    import tempfile

    from cuforge.store.bundle import BundleStore

    cache = resolve(cache)
    lock = os.path.abspath(os.fspath(lock))
    records = read_lock(lock)
    report = LockReport()
    entries: dict[str, Entry] = {}
    lacking = _collect(cache, records, entries)
    report.copied = len(entries)
    stanzas = [r for r in lacking if r.get("manifest")]
    # a stanza's relative paths start at its record's root (relative to the lock's dir:
    # where the recording ran), or at the lock's dir
    groups: dict[str, list[dict]] = {}
    for r in stanzas:
        root = os.path.normpath(os.path.join(os.path.dirname(lock), r.get("root") or "."))
        groups.setdefault(root, []).append(r)
    for root, group in sorted(groups.items()):
        text = "\n\n".join("\n".join(r["manifest"]) for r in group)
        manifest = parse_manifest(text, os.path.join(root, os.path.basename(lock)))
        with tempfile.TemporaryDirectory(prefix="cuforge-lock-") as tmp:
            part = os.path.join(tmp, "part.cfb")
            built = build(
                manifest, jobs=jobs, executor=executor, bundle=part, cache=cache,
                on_result=on_result,
            )  # fmt: skip
            report.built += built.built
            report.failures += [f"{r.label}: {r.log.strip()}" for r in built.failed]
            if built.ok:
                store = BundleStore(part)
                for info in store.iterate():
                    entry = store.get(info.key)
                    if entry is not None:
                        entries.setdefault(entry.key, entry)
                store.close()
    still = _collect(cache, [r for r in lacking if r["kind"] != "torch"], {})
    torch_done = (
        {r["name"] for r in stanzas if r["kind"] == "torch"} if not report.failures else set()
    )
    for r in still + [r for r in lacking if r["kind"] == "torch" and r["name"] not in torch_done]:
        report.missing.append(f"{r['system']} {r['name']} {r['key'][:16]}")
    if not report.ok:
        return report
    archs = sorted({e.meta.get("arch", "") for e in entries.values() if e.meta.get("arch")})
    report.bundle_bytes = write_bundle(
        bundle,
        sorted(entries.values(), key=lambda e: e.key),
        variants=sorted(f"{r['system']}:{r['name']}:{r['key'][:16]}" for r in records),
        archs=archs,
        manifest=os.path.basename(lock),
    )
    report.bundle = os.path.abspath(os.fspath(bundle))
    report.entries = len(entries)
    return report
