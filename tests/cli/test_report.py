"""``cuforge cache report`` and ``cache stats``'s sparkline: the data (core/report.py), the
page (cli/report_html.py) and the commands, against real cache dirs."""

from __future__ import annotations

import json
import os
import re
import time

import cuforge
from cuforge.adapters.switch import system_of_kind
from cuforge.cli import report_html
from cuforge.core.report import OWN, build_report, saved_per_day
from cuforge.store import telemetry
from tests.cli.conftest import SAXPY, Cli
from tests.cli.report_seed import HISTORY, NASTY, noon, seed


def _by_date(report):
    return {d.date.isoformat(): d for d in report.days}


def _day(back: int) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(noon(back)))


def test_seeded_history_is_counted_per_day_and_system(tmp_path):
    root = str(tmp_path / "cache")
    seed(root)
    report = build_report(root, days=14, system_of=system_of_kind)
    assert len(report.days) == 14 and report.days[-1].date.isoformat() == _day(0)
    days = _by_date(report)
    today = days[_day(0)]
    assert (today.hits, today.misses, today.builds) == (50, 6, 6)
    assert today.saved == {OWN: 30.0, "triton": 50.0}
    assert days[_day(1)].saved == {OWN: 20.0, "torch_compile": 120.0}
    assert days[_day(4)].saved == {"triton": 90.0, "cupy": 6.0}
    assert days[_day(6)].hit_rate == 5 / 20
    assert days[_day(3)].hit_rate is None and days[_day(3)].saved == {}
    # day 20 is outside the window: its 999 s are not counted
    inside = sum(s for back, k in HISTORY.items() if back < 14 for _h, _m, s in k.values())
    assert abs(report.seconds_saved - inside) < 1e-6
    assert report.systems == ["triton", "torch_compile", OWN, "cupy"]  # most saved first
    assert abs(report.saved_by_system["triton"] - 140.0) < 1e-6
    # the missing names: most misses first, the newest reasons kept
    assert [m.name for m in report.missed][0] == "gemm.cu"
    gemm = report.missed[0]
    assert gemm.misses == 3 and gemm.reasons == ["define TILE changed 2 -> 3"]
    assert {m.name for m in report.missed} == {"gemm.cu", NASTY, "softmax.cu"}
    # bytes: only what the remote was written (nothing compiled: the disk holds nothing)
    remote = {b.kind: b for b in report.tier_bytes if b.tier == "remote"}
    assert remote["kernel"].bytes == 3000 * (4 + 10 + 10 + 15 + 1) and not remote["kernel"].held
    # a window of 2 days holds today and yesterday only
    short = build_report(root, days=2, system_of=system_of_kind)
    assert [d.date.isoformat() for d in short.days] == [_day(1), _day(0)]
    assert abs(short.seconds_saved - 220.0) < 1e-6


def test_real_compiles_and_hits_count_today_with_bytes_held(tmp_path):
    root = str(tmp_path / "cache")
    cache = cuforge.Cache(root)
    cuforge.compile(SAXPY, name="saxpy.cu", arch="sm_90", cache=cache)
    warm = cuforge.Cache(root, memory=False)
    prog = cuforge.compile(SAXPY, name="saxpy.cu", arch="sm_90", cache=warm)
    assert prog.source_of_result == "disk"
    telemetry.flush(root)
    report = build_report(root, days=7, system_of=system_of_kind)
    today = report.days[-1]
    assert today.hits == 1 and today.misses == 1 and today.builds == 1
    assert today.hit_rate == 0.5
    assert set(today.saved) == {OWN} and today.saved[OWN] > 0
    held = {b.kind: b for b in report.tier_bytes if b.held}
    assert held["kernel"].tier == "disk" and held["kernel"].entries == 1
    assert held["kernel"].bytes > 0
    spark = saved_per_day(root, 14)
    assert len(spark) == 14 and spark[-1] == today.saved[OWN] and sum(spark[:-1]) == 0


def test_the_page_draws_the_charts_and_escapes_every_name(tmp_path):
    root = str(tmp_path / "cache")
    seed(root)
    page = report_html.render(build_report(root, days=14, system_of=system_of_kind))
    assert page.startswith("<!DOCTYPE html>")
    for chart in ('<svg class="saved"', '<svg class="rate"', '<svg class="bytes"'):
        assert chart in page
    assert page.count('<rect class="bar"') >= 8  # stacked days and byte rows
    assert '<polyline class="line"' in page
    assert NASTY not in page and "<evil>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;.cu" in page
    assert "header &lt;evil&gt;&amp;.h changed" in page
    for system in ("triton", "torch_compile", "cupy", OWN):
        assert system in page
    # self-contained: no script, nothing fetched
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "http://" not in page and "https://" not in page.replace("http://www.w3.org", "")


def test_an_empty_cache_renders_a_page_that_says_so(tmp_path):
    root = str(tmp_path / "never")
    report = build_report(root, days=14)
    assert report.empty and report.systems == [] and report.missed == []
    page = report_html.render(report)
    assert "This cache is empty" in page and "<svg" not in page
    assert not os.path.exists(root)  # reading a report creates nothing
    assert "empty" in report_html.text_summary(report)


def test_sparkline_scales_to_the_largest_day():
    assert report_html.sparkline([0, 1, 2, 4, 8]) == "▁▂▃▅█"
    assert report_html.sparkline([0.0] * 3) == "▁▁▁"
    assert report_html.sparkline([]) == ""


def test_report_command_writes_the_page_and_prints_a_summary(tmp_path):
    root = str(tmp_path / "cache")
    seed(root)
    cli = Cli(root)
    done = cli("cache", "report")
    assert done.returncode == 0, done.stderr
    assert "saved" in done.stdout and "gemm.cu" in done.stdout and "triton" in done.stdout
    out = tmp_path / "report.html"
    done = cli("cache", "report", "--html", str(out), "--days", "7")
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout
    page = out.read_text()
    assert '<svg class="saved"' in page and page.count("<text") > 7
    doc = cli.json("cache", "report", "--days", "3")
    assert doc["command"] == "cache report" and len(doc["days"]) == 3
    assert doc["days"][-1]["saved"] == {"cuforge": 30.0, "triton": 50.0}
    bad = cli("cache", "report", "--days", "0")
    assert bad.returncode == 2 and "--days" in bad.stderr
    missing_dir = cli("cache", "report", "--html", str(tmp_path / "no" / "such" / "r.html"))
    assert missing_dir.returncode == 1 and "could not write the report" in missing_dir.stderr


def test_stats_shows_the_sparkline_and_json_the_14_numbers(tmp_path):
    root = str(tmp_path / "cache")
    seed(root)
    cli = Cli(root)
    doc = cli.json("cache", "stats")
    spark = doc["saved_per_day"]
    assert len(spark) == 14 and spark[-1] == 80.0 and spark[-2] == 140.0
    assert spark[0] == 2.0  # 13 days back: the first of the 14
    text = cli("cache", "stats")
    assert text.returncode == 0
    line = next(x for x in text.stdout.splitlines() if x.startswith("last 14d"))
    assert re.search("[▁▂▃▄▅▆▇█]{14}", line)
    assert json.dumps(doc["saved_per_day"])  # plain numbers
