"""A cache dir with two weeks of history for ``cuforge cache report``'s tests.

The history is written through the record formats' own writers: telemetry lines through
``store.telemetry``'s appender (one flushed line per day, at noon local time) and explained
misses through ``keys.explain.log_miss``; the entries held are real compiles (NVRTC)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from cuforge.keys import explain
from cuforge.store import telemetry

#: a name that must come out escaped
NASTY = '<script>alert("x")</script>&.cu'

#: per day back (0: today): {kind: (chain hits, chain misses, seconds saved)}
HISTORY: dict[int, dict[str, tuple[int, int, float]]] = {
    0: {"kernel": (40, 4, 30.0), "triton": (10, 2, 50.0)},
    1: {"kernel": (30, 10, 20.0), "inductor": (5, 5, 120.0)},
    2: {"kernel": (10, 10, 8.0)},
    4: {"triton": (20, 1, 90.0), "cupy": (4, 0, 6.0)},
    6: {"kernel": (5, 15, 4.0)},
    13: {"kernel": (1, 1, 2.0)},
    20: {"kernel": (100, 0, 999.0)},  # outside a 14-day window
}


def noon(days_back: int, now: float | None = None) -> float:
    today = datetime.fromtimestamp(time.time() if now is None else now).date()
    day = today - timedelta(days=days_back)
    return datetime(day.year, day.month, day.day, 12).timestamp()


def seed(root: str) -> None:
    """Write :data:`HISTORY` and some explained misses under the cache dir ``root``."""
    for back, kinds in HISTORY.items():
        counts = []
        for kind, (hits, misses, seconds) in kinds.items():
            counts += [
                [telemetry.CHAIN, "hit", kind, hits, 0, 0.0],
                [telemetry.CHAIN, "miss", kind, misses, 0, 0.0],
                [telemetry.CHAIN, "build", kind, misses, 0, 0.0],
                ["disk", "hit", kind, hits, hits * 1000, seconds],
                ["disk", "put", kind, misses, misses * 2000, 0.0],
                ["remote", "put", kind, misses, misses * 3000, 0.0],
            ]
        line = {"v": 1, "t": noon(back) if back else time.time(), "pid": 1, "c": counts, "n": []}
        telemetry._append(root, line)
    for i in range(3):
        explain.log_miss(root, "gemm.cu", "a" * 64, [f"define TILE changed {i} -> {i + 1}"])
    explain.log_miss(root, NASTY, "b" * 64, ["header <evil>&.h changed"])
    explain.log_miss(root, "softmax.cu", "c" * 64, ["arch sm_80 -> sm_90"])
