"""``report.html``: the grid, the failures, the evidence, escaping; and that a real browser
(headless Chromium) renders it with the right counts and runs its script.

``resources/reports/showcase/report.xml`` comes from real ``cpmatrix run``s (see the README
there): passed, cached, failed, flaky, timeout and crash cells, and mutant runs.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import pytest

from cpmatrix.report import ReportCell, read_report
from cpmatrix.report.html import render_html, write_html
from cpmatrix.result import Status

REPORTS = Path(__file__).parents[1] / "resources" / "reports"
SHOWCASE = REPORTS / "showcase" / "report.xml"


class Page(HTMLParser):
    """The parts of a page the tests look at, collected from its (rendered) DOM."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.squares: list[dict[str, str]] = []
        self.totals: dict[str, int] = {}
        self.failures: list[str] = []
        self.tags: Counter[str] = Counter()
        self.attrs_of: dict[str, dict[str, str]] = {}
        self.text: list[str] = []
        #: Elements that would load something from elsewhere.
        self.fetches: list[str] = []
        self._in_script = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags[tag] += 1
        self._in_script = tag == "script"
        if tag in ("script", "img", "link", "iframe") and a.get("src", a.get("href")):
            self.fetches.append(tag)
        classes = a.get("class", "").split()
        if "sq" in classes:
            self.squares.append(a)
        if "total" in classes:
            self.totals[a["data-status"]] = int(a["data-count"])
        if "failure" in classes:
            self.failures.append(a["data-status"])
        if "id" in a:
            self.attrs_of[a["id"]] = a
        if tag == "html":
            self.attrs_of["<html>"] = a

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if not self._in_script:
            self.text.append(data)

    def square_counts(self) -> Counter[str]:
        return Counter(s["data-status"] for s in self.squares)


def expected_counts(cells: list[ReportCell]) -> Counter[str]:
    return Counter(c.status.value for c in cells if not c.mutant)


@pytest.mark.parametrize("report", ["showcase/report.xml", "faults.xml", "green.xml",
                                    "skipped.xml", "survivor.xml", "plain_junit.xml"])
def test_one_square_per_cell_colored_by_status(report: str) -> None:
    cells = read_report(REPORTS / report)
    page = Page(render_html(cells))
    counts = expected_counts(cells)
    assert page.square_counts() == counts
    assert page.totals == dict(counts)
    assert f"{sum(counts.values())} cells" in "".join(page.text)
    # Not-passed cells first, each with its traceback; mutant runs have their own section.
    bad = [c for c in cells if not c.mutant and c.status not in (Status.PASSED, Status.CACHED,
                                                                  Status.SKIPPED)]
    assert sorted(page.failures) == sorted(c.status.value for c in bad)


def test_showcase_has_every_status_a_run_produces_and_the_kill_rate() -> None:
    cells = read_report(SHOWCASE)
    counts = expected_counts(cells)
    assert {s for s in counts} == {"passed", "cached", "failed", "flaky", "timeout", "crash"}
    runs = [c for c in cells if c.mutant]
    killed = sum(1 for r in runs if r.evidence.get("mutant_outcome") == "killed")
    page = Page(render_html(cells))
    text = "".join(page.text)
    assert runs and 0 < killed < len(runs)
    assert f"Mutants: {killed}/{len(runs)} killed ({100 * killed / len(runs):.1f}%)" in text
    # Failures come first: crash, then timeout, failed, flaky (what to look at first).
    order = ["crash", "timeout", "failed", "flaky"]
    assert page.failures == sorted(page.failures, key=order.index)


def test_hover_text_carries_the_evidence() -> None:
    cells = read_report(SHOWCASE)
    page = Page(render_html(cells))
    by_id = {c.cell_id: c for c in cells if not c.mutant}
    titles = {page_sq["title"].split("\n")[0].split()[-1]: page_sq["title"]
              for page_sq in page.squares}
    assert set(titles) == set(by_id)
    parity = next(cid for cid, c in by_id.items() if "parity.max_abs" in c.evidence
                  and c.status is Status.PASSED)
    ev = by_id[parity].evidence
    short = f"{float(ev['parity.max_abs']):.3g}  (atol {float(ev['parity.atol']):.3g})"
    assert f"parity.max_abs = {short}" in titles[parity]
    crash = next(cid for cid, c in by_id.items() if c.status is Status.CRASH)
    assert f"failing ranks: {by_id[crash].properties['failing_ranks']}" in titles[crash]
    spill = Page(render_html(read_report(REPORTS / "spill.xml")))
    title = next(s["title"] for s in spill.squares if "softmax_spill" in s["title"])
    assert "spill stores 7420 B, loads 9508 B (budget 0 B), 255 registers, stack 3816 B" in title


def test_all_report_text_is_escaped_and_the_page_is_self_contained() -> None:
    evil = '</script><script>alert(1)</script><img src=x onerror="alert(2)">'
    cell = ReportCell(
        name="ring[unit,1x1,fp64,autocast=off,reference]@cpu", status=Status.FAILED,
        properties={"message": evil, "evidence.note": evil, "tags": evil},
        text=f"Traceback\n{evil}", headline=evil)
    page_text = render_html([cell], source=evil)
    page = Page(page_text)
    assert page.tags["script"] == 2  # the data block and the page's own script, no more
    assert page.tags["img"] == 0
    assert evil in "".join(page.text)  # shown to the reader as text
    # Nothing is fetched: no external scripts, styles, images or fonts.
    assert page.fetches == []
    assert "@import" not in page_text and "url(" not in page_text


def test_traceback_text_is_kept_in_the_failure_details() -> None:
    page = render_html(read_report(REPORTS / "failed.xml"))
    assert "&lt;html-like text &amp; must be escaped&gt;" in page
    assert 'File &quot;cases/ring.py&quot;, line 40, in ring_case' in page


def test_write_html(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    write_html(REPORTS / "faults.xml", out)
    assert Page(out.read_text()).square_counts() == expected_counts(
        read_report(REPORTS / "faults.xml"))


# --------------------------------------------------------------------------- in a browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True, text=True, timeout=120, check=False)


@needs_chromium
def test_chromium_renders_the_grid_with_the_right_counts(tmp_path: Path) -> None:
    html_path = tmp_path / "report.html"
    write_html(SHOWCASE, html_path)
    cells = read_report(SHOWCASE)
    crash = next(c for c in cells if c.status is Status.CRASH)
    url = f"{html_path.as_uri()}#cell={quote(crash.cell_id)}"
    proc = chromium(tmp_path, "--dump-dom", url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = Page(proc.stdout)
    # The script ran (it marks <html>) ...
    assert dom.attrs_of["<html>"].get("data-ready") == "1"
    # ... the grid has one square per cell, by status, and the totals agree.
    counts = expected_counts(cells)
    assert dom.square_counts() == counts
    assert dom.totals == dict(counts)
    assert f"{sum(counts.values())} cells" in "".join(dom.text)
    # ... and the #cell= link opened that cell's evidence panel.
    detail = dom.attrs_of["detail"]
    assert "hidden" not in detail
    assert detail["data-cell"] == crash.cell_id and detail["data-status"] == "crash"
    text = "".join(dom.text)
    assert f"CRASH  {crash.cell_id}" in text
    assert crash.headline in text


@needs_chromium
def test_chromium_screenshot(tmp_path: Path) -> None:
    html_path = tmp_path / "report.html"
    shot = tmp_path / "report.png"
    write_html(SHOWCASE, html_path)
    proc = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,900",
                    html_path.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1400, 900)
