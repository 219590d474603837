"""``cuforge cache report``'s page: one self-contained HTML file drawn from a
:class:`cuforge.core.report.Report`.

Inline CSS and inline SVG only: no script, no font, no image, nothing fetched, so it opens
from a file, a CI artifact or a mail attachment the same. Every string from the cache
(names, reasons, kinds, the dir) goes through :func:`html.escape`.
"""

from __future__ import annotations

import html
import math
from datetime import datetime

from cuforge.cli import output
from cuforge.core.report import Report

__all__ = ["render", "text_summary", "sparkline", "PALETTE"]

#: series colors (systems, kinds), in order; the rest repeat
PALETTE = ("#2f6fd6", "#e8833a", "#3aa76d", "#c94f7c", "#8a63d2", "#d1b12e", "#3fb4c4", "#7d7d7d")
#: the hit-rate line's color (none of the palette's, so a screenshot can find it)
LINE = "#1f3f8f"
BLOCKS = "▁▂▃▄▅▆▇█"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px 32px;
color:#1d2430;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.sub{color:#5b6575;margin:0 0 16px}.sub code{font-size:13px}
.tiles{display:flex;gap:12px;flex-wrap:wrap}
.tile{border:1px solid #dde2ea;border-radius:8px;padding:10px 16px;min-width:150px}
.tile b{display:block;font-size:22px}.tile span{color:#5b6575;font-size:12px}
.chart{border:1px solid #dde2ea;border-radius:8px;padding:8px}
.legend{display:flex;gap:16px;flex-wrap:wrap;margin:6px 0 0;font-size:12px;color:#39414f}
.legend i{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:5px;
vertical-align:-1px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #eceff4;vertical-align:top}
th{color:#5b6575;font-weight:600}.n{text-align:right;white-space:nowrap}
td code{font-size:12px}ul.r{margin:0;padding-left:16px}
.empty{border:1px dashed #b8c0cc;border-radius:8px;padding:28px;color:#39414f;font-size:15px}
.note{color:#5b6575;font-size:12px}
svg text{font:11px system-ui,sans-serif;fill:#39414f}
"""

_W = 1100  # chart width in px (the page is ~1200 wide)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _axis(peak_seconds: float) -> tuple[float, str, float]:
    """(axis top in seconds, unit, seconds per unit) for a 4-tick seconds axis: the unit
    the peak reads best in, and a top of 4 round steps (1, 2, 2.5, 5 x 10^n units)."""
    unit, per = "s", 1.0
    if peak_seconds <= 0:
        return 4.0, unit, per
    if peak_seconds >= 7200:
        unit, per = "h", 3600.0
    elif peak_seconds >= 120:
        unit, per = "min", 60.0
    raw = max(peak_seconds / per / 4, 1e-9)
    scale = 10 ** math.floor(math.log10(raw))
    step = next(m * scale for m in (1, 2, 2.5, 5, 10) if m * scale >= raw * (1 - 1e-9))
    return 4 * step * per, unit, per


def _legend(names: list[str], colors: dict[str, str]) -> str:
    items = "".join(f'<span><i style="background:{colors[n]}"></i>{_e(n)}</span>' for n in names)
    return f'<div class="legend">{items}</div>'


def _saved_chart(report: Report, colors: dict[str, str]) -> str:
    """Stacked bars: compile seconds saved per day, one color per system."""
    h, left, bottom, top = 260, 64, 36, 14
    plot_w, plot_h = _W - left - 12, h - bottom - top
    days = report.days
    peak, unit, per = _axis(max((d.seconds_saved for d in days), default=0.0))
    slot = plot_w / max(len(days), 1)
    bar = max(min(slot * 0.7, 48), 2)
    parts = [f'<svg class="saved" width="{_W}" height="{h}" viewBox="0 0 {_W} {h}" role="img">']
    parts.append("<title>compile seconds saved per day, by system</title>")
    for i in range(5):
        y = top + plot_h * i / 4
        value = peak * (4 - i) / 4
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{_W - 12}" y2="{y:.1f}" stroke="#eceff4"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{value / per:g} {unit}</text>"
        )
    label_every = max(1, len(days) // 14)
    for i, d in enumerate(days):
        x = left + slot * i + (slot - bar) / 2
        y = top + plot_h
        for system in report.systems:
            seconds = d.saved.get(system, 0.0)
            if seconds <= 0:
                continue
            bh = plot_h * seconds / peak
            y -= bh
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                f'height="{bh:.1f}" fill="{colors[system]}"><title>{_e(d.date.isoformat())} '
                f"{_e(system)}: {_e(output.human_seconds(seconds))} saved</title></rect>"
            )
        if i % label_every == 0 or i == len(days) - 1:
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{h - bottom + 16}" text-anchor="middle">'
                f"{_e(d.date.strftime('%b %d'))}</text>"
            )
    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{_W - 12}" y2="{top + plot_h}" '
        'stroke="#9aa3b2"/></svg>'
    )
    return "".join(parts)


def _rate_chart(report: Report) -> str:
    """A line: the whole chain's hit rate per day (days without lookups leave a gap)."""
    h, left, bottom, top = 200, 64, 36, 14
    plot_w, plot_h = _W - left - 12, h - bottom - top
    days = report.days
    slot = plot_w / max(len(days), 1)
    parts = [f'<svg class="rate" width="{_W}" height="{h}" viewBox="0 0 {_W} {h}" role="img">']
    parts.append("<title>hit rate per day</title>")
    for pct in (0, 25, 50, 75, 100):
        y = top + plot_h * (100 - pct) / 100
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{_W - 12}" y2="{y:.1f}" stroke="#eceff4"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{pct}%</text>'
        )
    runs: list[list[tuple[float, float]]] = [[]]
    points = []
    label_every = max(1, len(days) // 14)
    for i, d in enumerate(days):
        x = left + slot * (i + 0.5)
        rate = d.hit_rate
        if rate is None:
            if runs[-1]:
                runs.append([])
        else:
            y = top + plot_h * (1 - rate)
            runs[-1].append((x, y))
            points.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{LINE}"><title>'
                f"{_e(d.date.isoformat())}: {100 * rate:.0f}% of {d.hits + d.misses} "
                "lookups hit</title></circle>"
            )
        if i % label_every == 0 or i == len(days) - 1:
            parts.append(
                f'<text x="{x:.1f}" y="{h - bottom + 16}" text-anchor="middle">'
                f"{_e(d.date.strftime('%b %d'))}</text>"
            )
    for run in runs:
        if len(run) > 1:
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            parts.append(
                f'<polyline class="line" points="{pts}" fill="none" stroke="{LINE}" '
                'stroke-width="2.5"/>'
            )
    parts.extend(points)
    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{_W - 12}" y2="{top + plot_h}" '
        'stroke="#9aa3b2"/></svg>'
    )
    return "".join(parts)


def _bytes_chart(report: Report, colors: dict[str, str]) -> str:
    """Horizontal bars: bytes per tier and kind (held by the disk tier; written to the
    others in the window)."""
    rows = report.tier_bytes
    row_h, left = 26, 230
    h = row_h * len(rows) + 30
    plot_w = _W - left - 230  # room for the value after the longest bar
    peak = max((r.bytes for r in rows), default=0) or 1
    parts = [f'<svg class="bytes" width="{_W}" height="{h}" viewBox="0 0 {_W} {h}" role="img">']
    parts.append("<title>bytes by tier and kind</title>")
    for i, r in enumerate(rows):
        y = 8 + row_h * i
        w = max(plot_w * r.bytes / peak, 2)
        what = "held" if r.held else "written"
        parts.append(
            f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{_e(r.tier)} · {_e(r.kind)}'
            f"</text>"
            f'<rect class="bar" x="{left}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" '
            f'fill="{colors[r.kind]}"><title>{_e(r.tier)} {_e(r.kind)}: '
            f"{_e(output.human_bytes(r.bytes))} {what} ({r.entries} entries)</title></rect>"
            f'<text x="{left + w + 6:.1f}" y="{y + 15}">{_e(output.human_bytes(r.bytes))} '
            f"{what}, {r.entries} entr{'y' if r.entries == 1 else 'ies'}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _missed_table(report: Report) -> str:
    if not report.missed:
        return '<p class="note">No explained misses in this window.</p>'
    rows = []
    for m in report.missed:
        reasons = "".join(f"<li>{_e(r)}</li>" for r in m.reasons) or "<li>(no reason)</li>"
        rows.append(
            f"<tr><td><code>{_e(m.name)}</code></td><td class=n>{m.misses}</td>"
            f"<td class=n>{_e(output.human_time(m.last))}</td>"
            f'<td><ul class="r">{reasons}</ul></td></tr>'
        )
    return (
        "<table><tr><th>name</th><th class=n>misses</th><th class=n>last</th>"
        "<th>why (the last miss)</th></tr>" + "".join(rows) + "</table>"
    )


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>{body}</body></html>\n"
    )


def render(report: Report) -> str:
    """The whole page."""
    days = report.days
    span = f"{days[0].date.isoformat()} to {days[-1].date.isoformat()} ({len(days)} days)"
    made = datetime.fromtimestamp(report.generated).strftime("%Y-%m-%d %H:%M")
    head = (
        "<h1>cuforge cache report</h1>"
        f'<p class="sub"><code>{_e(report.cache_dir)}</code> · {_e(span)} · made {_e(made)}</p>'
    )
    if report.empty:
        why = (
            "Telemetry is off (CUFORGE_TELEMETRY=0), so no hits or misses are recorded."
            if not report.telemetry_enabled
            else "Compile something with this cache and run the report again."
        )
        body = (
            head + '<div class="empty"><b>This cache is empty.</b> It holds no entries and '
            f"recorded no lookups, builds or misses in these {len(days)} days. {_e(why)}</div>"
        )
        return _page("cuforge cache report (empty)", body)

    colors = {s: _color(i) for i, s in enumerate(report.systems)}
    kinds = sorted({b.kind for b in report.tier_bytes})
    kind_colors = {k: _color(i) for i, k in enumerate(kinds)}
    rate = report.hit_rate
    tiles = [
        (output.human_seconds(report.seconds_saved), "compile time saved"),
        (f"{100 * rate:.0f}%" if rate is not None else "-", "hit rate"),
        (f"{report.hits + report.misses}", "lookups"),
        (f"{report.builds}", "builds"),
        (f"{sum(m.misses for m in report.missed)}", "explained misses (top names)"),
    ]
    body = [head, '<div class="tiles">']
    body += [f'<div class="tile"><b>{_e(v)}</b><span>{_e(k)}</span></div>' for v, k in tiles]
    body.append("</div>")
    body.append("<h2>Compile time saved per day, by system</h2>")
    if report.systems:
        body.append(f'<div class="chart">{_saved_chart(report, colors)}')
        body.append(_legend(report.systems, colors) + "</div>")
    else:
        body.append('<p class="note">No hits in this window: nothing saved yet.</p>')
    body.append("<h2>Hit rate per day</h2>")
    if any(d.hit_rate is not None for d in days):
        body.append(f'<div class="chart">{_rate_chart(report)}</div>')
        body.append(
            '<p class="note">Each lookup of the whole chain (memory, disk, remotes, bundles) '
            "counted once, as <code>cuforge cache stats</code> counts them.</p>"
        )
    else:
        body.append('<p class="note">No lookups in this window.</p>')
    body.append("<h2>Kernels that keep missing</h2>")
    body.append(_missed_table(report))
    body.append("<h2>Bytes by tier and kind</h2>")
    if report.tier_bytes:
        body.append(f'<div class="chart">{_bytes_chart(report, kind_colors)}')
        body.append(_legend(kinds, kind_colors) + "</div>")
        body.append(
            '<p class="note">disk: what it holds now; other tiers (a remote is not listed): '
            "what was written to them in this window.</p>"
        )
    else:
        body.append('<p class="note">Nothing held or written.</p>')
    return _page("cuforge cache report", "".join(body))


def sparkline(values: list[float]) -> str:
    """One block per value, scaled to the largest (all zero: the lowest block each)."""
    peak = max(values, default=0.0)
    if peak <= 0:
        return BLOCKS[0] * len(values)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round(top * max(v, 0.0) / peak)] for v in values)


def text_summary(report: Report) -> str:
    """A few lines for the terminal (``cuforge cache report`` without ``--html``)."""
    days = report.days
    lines = [
        f"cache dir   {report.cache_dir}",
        f"window      {days[0].date.isoformat()} to {days[-1].date.isoformat()} ({len(days)} days)",
    ]
    if report.empty:
        lines.append("empty       no entries, and nothing recorded in this window")
        return "\n".join(lines)
    rate = report.hit_rate
    lines.append(
        f"saved       {output.human_seconds(report.seconds_saved)} of compiling  "
        f"{sparkline([d.seconds_saved for d in days])}"
    )
    by_system = report.saved_by_system
    if by_system:
        lines.append(
            "by system   "
            + ", ".join(f"{s} {output.human_seconds(by_system[s])}" for s in report.systems)
        )
    lines.append(
        f"lookups     {report.hits + report.misses}: {report.hits} hits"
        + (f" ({100 * rate:.0f}%)" if rate is not None else "")
        + f", {report.misses} misses; {report.builds} builds"
    )
    for m in report.missed[:5]:
        why = m.reasons[0] if m.reasons else "(no reason)"
        lines.append(f"missing     {m.name}: {m.misses}x, last: {why}")
    lines.append("(charts: cuforge cache report --html FILE)")
    return "\n".join(lines)
