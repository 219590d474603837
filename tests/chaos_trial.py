"""What the chaos suite's processes do (tests/test_chaos.py): compile every kernel and say
whether its bytes are right, and one trial of the corruption fuzzer.

No pytest here: children import this module (``python -c "from tests.chaos_trial import
..."`` with the repository root on ``PYTHONPATH``), and so does the test process, which runs
a fuzzer trial in-process when the damage cannot hang it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import traceback
from contextlib import redirect_stderr, redirect_stdout

KERNELS = 12

#: what the fuzzer runs after compiling against a damaged cache dir; each must finish with
#: exit code 0 or 1 and no traceback
COMMANDS = (
    ("cache", "verify", "--repair"),
    ("cache", "stats"),
    ("cache", "ls"),
    ("cache", "prune"),
)


def kernel_source(i: int) -> str:
    return f'extern "C" __global__ void k{i}(int* out) {{ *out = {i * 7919}; }}\n'


def compile_all(expected: dict[str, str], rounds: int = 1, echo: bool = False) -> list[str]:
    """Compile every kernel named in ``expected`` (name -> sha256 of its cubin), in a random
    order, ``rounds`` times; one line per result: ``"OK|BAD name source_of_result"``."""
    import cuforge

    names = sorted(expected)
    lines: list[str] = []
    for _ in range(rounds):
        random.shuffle(names)
        for name in names:
            prog = cuforge.compile(kernel_source(int(name[1:-3])), name=name, arch="sm_90")
            ok = hashlib.sha256(prog.binary).hexdigest() == expected[name]
            line = ("OK " if ok else "BAD ") + name + " " + prog.source_of_result
            if echo:
                print(line, flush=True)
            else:
                lines.append(line)
    return lines


def worker() -> None:
    """A chaos worker's main: :func:`compile_all` of ``$CHAOS_EXPECTED``, ``$CHAOS_ROUNDS``
    times, each result printed as it comes (a SIGKILL loses none printed before it)."""
    expected = json.loads(os.environ["CHAOS_EXPECTED"])
    compile_all(expected, int(os.environ.get("CHAOS_ROUNDS", "1")), echo=True)


def cli(*args: str) -> tuple[int, str, str]:
    """``cuforge ARGS`` in this process (as CI runs it): (exit code, stdout, stderr). An
    exception that escapes the command line is a crash: its traceback ends up in stderr."""
    from cuforge.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    ci = os.environ.get("CI")
    os.environ["CI"] = "true"
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except Exception:  # noqa: BLE001 - a crash is what the fuzzer looks for
                traceback.print_exc()
                code = 1
    finally:
        if ci is None:
            del os.environ["CI"]
        else:
            os.environ["CI"] = ci
    return code, out.getvalue(), err.getvalue()


def trial(expected: dict[str, str], label: str) -> list[str]:
    """One fuzzer trial against the damaged cache dir ``$CUFORGE_CACHE_DIR``: every kernel
    compiles to the right bytes, each of :data:`COMMANDS` finishes without a crash, and
    ``cache verify`` is clean after ``--repair``. Returns the problems found (``label``
    first in each)."""
    from cuforge.store import telemetry

    problems: list[str] = []
    try:
        results = compile_all(expected)
    except Exception:  # noqa: BLE001 - a failed compile is a finding, reported below
        results = []
        problems.append(f"{label}: compile failed:\n{traceback.format_exc()[-2000:]}")
    telemetry.flush()  # as the exit of a process that compiled would
    wrong = [line for line in results if not line.startswith("OK ")]
    if not problems and (len(results) != len(expected) or wrong):
        problems.append(f"{label}: wrong or missing results: {wrong or results}")
    for args in COMMANDS:
        code, _out, err = cli(*args)
        if code not in (0, 1) or "Traceback" in err:
            problems.append(f"{label}: cuforge {' '.join(args)} -> {code}\n{err[-2000:]}")
    code, out, _err = cli("cache", "verify")
    if code != 0:
        problems.append(f"{label}: verify after --repair still fails:\n{out[-1500:]}")
    return problems


def trial_main() -> None:
    """A child's main for one trial: prints ``{"problems": [...]}``."""
    problems = trial(json.loads(os.environ["CHAOS_EXPECTED"]), os.environ["CHAOS_LABEL"])
    print(json.dumps({"problems": problems}))
