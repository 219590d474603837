"""Ahead-of-time builds: manifests, ``cuforge build``, bundles (layer 5).

* :mod:`cuforge.aot.manifest` -- ``cuforge.toml`` / ``[tool.cuforge]``: parse and expand
  into :class:`~cuforge.aot.tasks.BuildTask` variants.
* :mod:`cuforge.aot.tasks` -- one variant as a self-contained, content-addressed task, and
  :func:`~cuforge.aot.tasks.run_task`, which makes exactly the JIT call a user would make.
* :mod:`cuforge.aot.executor` -- where tasks run: :class:`~cuforge.aot.executor.LocalExecutor`
  (a process pool); ``cuforge.aot.ray_executor`` (Ray) plugs in the same way.
* :mod:`cuforge.aot.build` -- ``cuforge build``: expand, skip what is cached, run the rest.
* :mod:`cuforge.aot.bundle` -- write / install / load ``.cfb`` bundles.

Nothing here is imported by ``import cuforge``.
"""
