"""One heavy ``.cu``, compiled with nvcc's host and device pipelines in parallel.

``nvcc -c`` runs its steps one after the other (``nvcc --dryrun`` lists them)::

    host:    gcc -E (host)   -> cudafe++ (writes the module id)
    device:  gcc -E (device) -> cicc (reads the module id) -> ptxas -> fatbinary
    final:   gcc -c of cudafe++'s output (which #includes the fatbin)

For a TU that includes torch's headers, cudafe++ and cicc each parse all of torch
(~40 s and ~50 s on these cores). The only thing the device side takes from the host
side is the *module id* file, a unique name for the TU. Writing that file first (from
the source's path and content, in nvcc's own format) and dropping ``--gen_module_id_file``
from cudafe++ lets the two lanes run at the same time; the final host compile then waits
for both. The depfile comes from the host preprocessor (``-MD -MF``).

Run as ``python -m cuforge.torch.nvcc_split DEPFILE -- NVCC ARGS... -c SRC -o OUT``
(what build.ninja does for a TU that includes torch). Anything this does not recognize
in the dry run (``-rdc``, ``-G``, several host compiles) falls back to plain nvcc.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys

__all__ = ["main", "plan_commands"]

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class Fallback(Exception):
    """The dry run has a shape this module does not split."""


def _value(raw: str) -> str:
    raw = raw.strip()
    if not raw:
        return ""
    try:
        return " ".join(shlex.split(raw))
    except ValueError:
        return raw


def plan_commands(lines: list[str], env: dict[str, str]):
    """(env, host lane, device lane, final) from ``nvcc --dryrun`` output lines."""
    host: list[str] = []
    device: list[str] = []
    final: list[str] = []
    env = dict(env)
    for line in lines:
        if not line.startswith("#$ "):
            continue
        cmd = line[3:].strip()
        m = _ASSIGN.match(cmd)
        if m and not cmd.startswith(("gcc", "g++", "cudafe++")):
            env[m.group(1)] = _value(m.group(2)).replace("$PATH", env.get("PATH", ""))
            continue
        if cmd.startswith("-- "):
            raise Fallback(cmd)
        prog = os.path.basename(cmd.split()[0].strip('"'))
        if prog in ("gcc", "g++", "c++", "cc") or prog.endswith(("-gcc", "-g++")):
            if " -E " in cmd:
                (device if "-D__CUDA_ARCH__=" in cmd else host).append(cmd)
            elif " -c " in cmd:
                final.append(cmd)
            else:
                raise Fallback(cmd)
        elif prog == "cudafe++":
            host.append(cmd)
        elif prog in ("cicc", "ptxas", "fatbinary", "rm") or cmd.startswith('"$CICC_PATH/cicc"'):
            device.append(cmd)
        else:
            raise Fallback(cmd)
    if len(final) != 1 or len(host) != 2 or not device:
        raise Fallback("unexpected pipeline shape")
    return env, host, device, final[0]


def _module_id(src: str) -> str:
    """A module id in nvcc's format: _<hash>_<len>_<name>_<hash>."""
    with open(src, "rb") as f:
        digest = hashlib.sha256(os.path.abspath(src).encode() + b"\0" + f.read()).hexdigest()
    base = re.sub(r"[^A-Za-z0-9_]", "_", os.path.basename(src))
    return f"_{digest[:8]}_{len(base)}_{base}_{digest[8:16]}"


def _run_lanes(lanes: list[list[str]], env: dict[str, str]) -> list[tuple[int, str]]:
    procs = [
        subprocess.Popen(
            ["/bin/sh", "-c", " && ".join(lane)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for lane in lanes
    ]
    return [(p.wait(), p.stdout.read().decode("utf-8", "replace")) for p in procs]  # type: ignore[union-attr]


def split_compile(depfile: str, argv: list[str]) -> int:
    nvcc, args = argv[0], argv[1:]
    if "-c" not in args or "-o" not in args:
        raise Fallback("not a -c compile")
    src = args[args.index("-c") + 1]
    out = args[args.index("-o") + 1]
    keep = out + ".split"
    shutil.rmtree(keep, ignore_errors=True)
    os.makedirs(keep)
    dry = subprocess.run(
        [nvcc, "--dryrun", "--keep", "--keep-dir", keep, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if dry.returncode != 0:
        raise Fallback("dry run failed")
    env, host, device, final = plan_commands(
        (dry.stdout + dry.stderr).splitlines(), dict(os.environ)
    )
    cudafe = host[1]
    m = re.search(r'--module_id_file_name "([^"]+)"', cudafe)
    if "--gen_module_id_file" not in cudafe or m is None:
        raise Fallback("no module id in cudafe++'s command")
    with open(m.group(1), "w", encoding="utf-8") as f:
        f.write(_module_id(src))
    host[1] = cudafe.replace("--gen_module_id_file", "")
    host[0] = host[0] + f" -MD -MF {depfile!r} -MT {out!r}".replace("'", '"')
    results = _run_lanes([host, device], env)
    for rc, text in results:
        if rc != 0:
            sys.stderr.write(text)
            return rc
    for _, text in results:
        sys.stderr.write(text)
    done = subprocess.run(["/bin/sh", "-c", final], env=env, check=False)
    if done.returncode == 0:
        shutil.rmtree(keep, ignore_errors=True)
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m cuforge.torch.nvcc_split DEPFILE -- NVCC ARGS...", file=sys.stderr)
        return 2
    depfile, cmd = argv[0], argv[2:]
    try:
        return split_compile(depfile, cmd)
    except Fallback:
        return subprocess.run([cmd[0], "-MD", "-MF", depfile, *cmd[1:]], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
