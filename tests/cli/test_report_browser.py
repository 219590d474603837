"""``cuforge cache report --html`` rendered by a real headless Chromium: the screenshot
shows the charts (colored pixels where each chart is drawn). In ``make test-integrations``;
Chromium comes from Debian (``.ci/run`` installs it)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from cuforge.cli.report_html import LINE
from tests.cli.conftest import Cli
from tests.cli.report_seed import seed

CHROMIUM = "/usr/bin/chromium"
WIDTH, HEIGHT = 1200, 1600

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent (apt-get install chromium)"
)


def _screenshot(page: str, tmp_path) -> str:
    png = str(tmp_path / "shot.png")
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={png}",
            f"--window-size={WIDTH},{HEIGHT}",
            f"file://{page}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and os.path.exists(png), done.stderr[-2000:]
    return png


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def _rows(image, colors: set[tuple[int, int, int]], min_run: int) -> list[int]:
    """The pixel rows (y) where the colors fill at least ``min_run`` pixels."""
    px = image.load()
    return [
        y
        for y in range(image.height)
        if sum(1 for x in range(image.width) if px[x, y] in colors) >= min_run
    ]


def _section(html: str, cls: str) -> str:
    start = html.index(f'<svg class="{cls}"')
    return html[start : html.index("</svg>", start)]


def _fills(svg: str) -> set[tuple[int, int, int]]:
    return {_rgb(c) for c in re.findall(r'class="bar"[^>]*fill="(#[0-9a-f]{6})"', svg)}


def test_the_page_shows_every_chart_in_a_real_browser(tmp_path):
    image_module = pytest.importorskip(
        "PIL.Image", reason="Pillow reads the screenshot: pip install -e '.[test]'"
    )

    root = str(tmp_path / "cache")
    seed(root)
    page = str(tmp_path / "report.html")
    done = Cli(root)("cache", "report", "--html", page)
    assert done.returncode == 0, done.stderr
    html = open(page, encoding="utf-8").read()
    image = image_module.open(_screenshot(page, tmp_path)).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)

    # the hit-rate line and its points, in their own color
    line = _rows(image, {_rgb(LINE)}, 3)
    assert len(line) >= 20, "the hit-rate line is hardly drawn"
    # the stacked bars of time saved: each system's color drawn above the line chart
    saved = _fills(_section(html, "saved"))
    assert len(saved) == 4
    for color in saved:
        bars = [y for y in _rows(image, {color}, 12) if y < line[0]]
        assert len(bars) >= 3, f"the saved-time bars of {color} are not drawn"
    assert len([y for y in _rows(image, saved, 12) if y < line[0]]) >= 60
    # the bytes bars (18 px high each): below the line chart
    byte_colors = _fills(_section(html, "bytes"))
    below = [y for y in _rows(image, byte_colors, 40) if y > line[-1]]
    assert len(below) >= 2 * 14, "the bytes chart is not drawn"
    # text rendered and a mostly white page: not blank, not an error page
    px = image.load()
    samples = [px[x, y] for y in range(0, HEIGHT, 3) for x in range(0, WIDTH, 3)]
    assert sum(1 for p in samples if sum(p) < 200) > 500
    assert sum(1 for p in samples if p == (255, 255, 255)) > len(samples) // 2
