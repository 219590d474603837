"""The GPU and runtime checks: the visible GPUs (their arch support, the driver against
the compilers), the arch-list variables, build parallelism, the fast launch path."""

from __future__ import annotations

import os

from cuforge import toolchain
from cuforge.base.arch import arch_findings, arch_to_torch, parse_arch_list
from cuforge.cli import output
from cuforge.cli.doctor.base import Check, Probe, row_maker
from cuforge.runtime import fastlaunch
from cuforge.toolchain.facts import kernel_driver_version, version_tuple
from cuforge.torch.jobs import TORCH_TU_BYTES, recommended_jobs


def check_gpus(p: Probe) -> list[Check]:
    gpu_row = row_maker("gpu", "GPUs")
    arch_row = row_maker("gpu.arch", "GPU arch support")
    driver_row = row_maker("gpu.driver", "driver vs toolkit")
    gpus, why = p.gpus()
    if not gpus:
        return [
            gpu_row("SKIP", f"no GPU: {why}", gpus=[]),
            arch_row("SKIP", "skipped: no GPU"),
            driver_row("SKIP", "skipped: no GPU"),
        ]
    driver = toolchain.driver_version()
    kernel_driver = kernel_driver_version()
    drv = f"{driver // 1000}.{driver % 1000 // 10}" if driver else "?"
    desc = "; ".join(f"#{g['index']} {g['name']} ({g['arch']})" for g in gpus)
    rows = [
        gpu_row(
            "PASS",
            f"{desc}; driver {kernel_driver or '?'} (CUDA {drv})",
            gpus=gpus,
            driver_cuda=driver,
            driver=kernel_driver,
        )
    ]
    # Can the compilers target each GPU's arch?
    archs = sorted({g["arch"] for g in gpus})
    problems, notes = [], []
    for backend in ("nvrtc", "nvcc"):
        supported = p.once(f"supported.{backend}", lambda b=backend: toolchain.supported_archs(b))
        if not supported:
            notes.append(f"{backend}: unavailable")
            continue
        bad = [a for a in archs if a not in supported]
        if bad:
            problems.append(f"{backend} cannot build {', '.join(bad)}")
        else:
            notes.append(f"{backend} builds {', '.join(archs)}")
    if problems:
        rows.append(
            arch_row(
                "FAIL" if any(pb.startswith("nvrtc") for pb in problems) else "WARN",
                "; ".join(problems + notes),
                "install a newer CUDA toolkit / nvidia-cuda-nvrtc that knows this GPU",
            )
        )
    else:
        rows.append(arch_row("PASS", "; ".join(notes)))
    # Is the driver new enough for what the compilers emit?
    if not driver:
        rows.append(
            driver_row("WARN", "the driver's CUDA version is unknown", "update the NVIDIA driver")
        )
        return rows
    dv = (driver // 1000, driver % 1000 // 10)
    worst, lines, fix = "PASS", [], None
    for label, version in (
        ("NVRTC", toolchain.nvrtc_version()),
        ("nvcc", toolchain.nvcc_version()),
    ):
        tv = version_tuple(version)[:2]
        if len(tv) < 2:
            continue
        if tv[0] > dv[0]:
            worst = "FAIL"
            lines.append(
                f"{label} {version} is CUDA {tv[0]}, the driver only CUDA {drv}: its output "
                "cannot load (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)"
            )
            fix = (
                f"install a driver for CUDA {tv[0]}.{tv[1]}+, or a CUDA {dv[0]} toolkit / "
                "nvidia-cuda-nvrtc"
            )
        elif tv > dv:
            worst = "WARN" if worst == "PASS" else worst
            lines.append(
                f"{label} {version} is newer than the driver's CUDA {drv}: cubins load, but its "
                "PTX fails with CUDA_ERROR_UNSUPPORTED_PTX_VERSION"
            )
            fix = fix or (
                f"compile to cubin (the default), or install a driver for CUDA {tv[0]}.{tv[1]}+"
            )
        else:
            lines.append(f"{label} {version} <= driver CUDA {drv}")
    rows.append(driver_row(worst, "; ".join(lines), fix))
    return rows


def check_arch_list(p: Probe) -> list[Check]:
    gpus, why = p.gpus()
    gpu_archs = sorted({g["arch"] for g in gpus})
    supported = p.once("supported.nvrtc", lambda: toolchain.supported_archs("nvrtc"))
    rows = []
    for name in ("TORCH_CUDA_ARCH_LIST", "CUFORGE_ARCH"):
        value = os.environ.get(name)
        if not value:
            continue
        row = row_maker(f"arch_list.{name}", name)
        found = arch_findings(name, value, gpu_archs, supported)
        if not found:
            rows.append(row("PASS", f"{name}={value!r}"))
            continue
        rows.append(
            row(
                "FAIL" if any(st == "FAIL" for st, _, _ in found) else "WARN",
                "; ".join(msg for _, msg, _ in found),
                next(fix for _, _, fix in found if fix),
                findings=[{"status": s, "message": m, "fix": f} for s, m, f in found],
            )
        )
    if rows:
        return rows
    row = row_maker("arch_list", "arch list")
    if gpu_archs:
        want = ";".join(arch_to_torch(a) for a in gpu_archs)
        return [
            row(
                "WARN",
                f"not set: kernels use the visible GPU ({', '.join(gpu_archs)}), torch "
                "extensions build for every visible card and warn; pin it for "
                "reproducible, shareable builds",
                f"export TORCH_CUDA_ARCH_LIST='{want}'",
            )
        ]
    return [
        row(
            "WARN",
            f"not set, and {why}: compile() without arch= raises ArchError, "
            "and torch cannot tell which arch to build",
            "export CUFORGE_ARCH=sm_90 TORCH_CUDA_ARCH_LIST='9.0'  (your target GPU)",
        )
    ]


def check_arch_agreement(p: Probe) -> list[Check]:
    """CUFORGE_ARCH against TORCH_CUDA_ARCH_LIST when both are set."""

    row = row_maker("arch_list.agreement", "CUFORGE_ARCH vs torch")
    ours = os.environ.get("CUFORGE_ARCH", "").strip()
    torch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if not (ours and torch_list):
        return []
    try:
        a, b = parse_arch_list(ours), parse_arch_list(torch_list)
    except ValueError:
        return []  # the arch_list rows report the unreadable one
    data = {"CUFORGE_ARCH": list(a), "TORCH_CUDA_ARCH_LIST": list(b)}
    if sorted(set(a)) == sorted(set(b)):
        return [row("PASS", f"both name {', '.join(a)}", **data)]
    return [
        row(
            "WARN",
            f"CUFORGE_ARCH={ours!r} ({', '.join(a)}) and TORCH_CUDA_ARCH_LIST="
            f"{torch_list!r} ({', '.join(b)}) disagree. With no GPU visible, CUFORGE_ARCH wins "
            "for cuforge (cuforge.compile, `cuforge compile`, cuforge.torch builds); "
            "TORCH_CUDA_ARCH_LIST decides plain torch.utils.cpp_extension and setup.py builds",
            "unset CUFORGE_ARCH  (or export TORCH_CUDA_ARCH_LIST to the same archs)",
            **data,
        )
    ]


def check_jobs(p: Probe) -> list[Check]:
    res = p.resources
    cores, mem = res["cores"], res["memory_available"] or 0
    jobs, why = recommended_jobs(res)
    row = row_maker("build_jobs", "build jobs")
    data = {**res, "recommended": jobs}
    fix = f"export MAX_JOBS={jobs}"
    have = f"{cores} cores, {output.human_bytes(mem)} available"
    current = os.environ.get("MAX_JOBS")
    if not current:
        ninja_default = cores + 2
        if mem and ninja_default * TORCH_TU_BYTES > mem:
            return [
                row(
                    "WARN",
                    f"MAX_JOBS unset: ninja runs {ninja_default} jobs, but "
                    f"{output.human_bytes(mem)} fits {jobs} ({why})",
                    fix,
                    **data,
                )
            ]
        return [row("PASS", f"{have}: {jobs} jobs ({why})", **data)]
    if not current.strip().isdigit():
        return [row("FAIL", f"MAX_JOBS={current!r} is not a number", fix, **data)]
    n = int(current)
    if mem and n * TORCH_TU_BYTES > mem:
        need = output.human_bytes(n * TORCH_TU_BYTES)
        return [
            row(
                "WARN",
                f"MAX_JOBS={n} needs ~{need}, {output.human_bytes(mem)} available: builds may "
                "be OOM-killed",
                fix,
                **data,
            )
        ]
    if n > cores * 2:
        return [row("WARN", f"MAX_JOBS={n} for {cores} cores oversubscribes the CPU", fix, **data)]
    return [row("PASS", f"MAX_JOBS={n}; {have}", **data)]


def check_fast_launch(p: Probe) -> list[Check]:
    """Which fast launch path kernels use: the C extension installed with cuforge, one
    built on first use into the cache dir, or the ~1.4x slower pure-Python path."""

    row = row_maker("fast_launch", "fast launch path")
    path, detail = fastlaunch.status()
    if path == "installed":
        return [row("PASS", f"the C launcher installed with cuforge ({detail})", path=path)]
    if path == "built":
        return [
            row(
                "PASS",
                f"the C launcher built on first use ({detail})",
                path=path,
            )
        ]
    return [
        row(
            "WARN",
            f"launches use the pure-Python path, ~1.4x slower than the C launcher: {detail}",
            "install a C compiler and the Python headers (apt-get install gcc python3-dev), "
            "then pip install --force-reinstall cuforge",
            path=path,
        )
    ]
