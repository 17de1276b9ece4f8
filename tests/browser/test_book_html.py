"""The built HTML book as a reader sees it, in headless Chromium with the network off
(tests/browser/book_browser.py does the looking; this file states what must hold).

Needs a built book (``make book``; ``make test`` runs this file after its strict build) and Debian's
Chromium with the ``playwright`` package. Where either is missing the tests are skipped with the
reason, unless ``POSENC_REQUIRE_BROWSER=1`` (set by ``make test`` in CI), which makes it a failure.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

import book_browser

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("POSENC_HTML", ROOT / "_build" / "html"))
OUT = ROOT / "_build" / "browser"
REQUIRED = os.environ.get("POSENC_REQUIRE_BROWSER") == "1"


def why_not() -> str | None:
    if not (HTML / "index.html").is_file():
        return f"no built book at {HTML} (run make book)"
    return book_browser.browser_available()


PAGES = book_browser.pages_of(HTML) if (HTML / "index.html").is_file() else []


@pytest.fixture(scope="module")
def report() -> book_browser.Report:
    why = why_not()
    if why:
        if REQUIRED:
            pytest.fail(f"the browser test must run here (POSENC_REQUIRE_BROWSER=1) but cannot: {why}")
        pytest.skip(why)
    result = book_browser.check_book(HTML, OUT)
    (OUT / "report.json").write_text(json.dumps(asdict(result), indent=1))
    (OUT / "pages.md").write_text(result.table() + "\n")
    return result


def test_the_book_is_built_with_every_chapter(report):
    chapters = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    pages = {p.page for p in report.pages}
    assert {f"book/{c}.html" for c in chapters} <= pages


@pytest.mark.parametrize("name", PAGES)
def test_page_reads_cleanly_offline(report, name):
    """No console error, nothing fetched from another host, every equation typeset (also when the
    page is opened from disk), every figure loaded with content, no raw TeX, code within its column,
    no glued output twice, no visible set-up cell, collapsed checks captioned."""
    (page,) = [p for p in report.pages if p.page == name]
    assert page.ok, asdict(page)
    assert page.typeset == page.equations
    assert page.typeset_from_disk in (None, page.equations)
    assert page.figures_ok == page.figures


def test_chapters_have_typeset_equations_figures_and_collapsed_checks(report):
    for page in report.pages:
        if page.page.startswith("book/0") and page.page.endswith(".html"):
            assert page.equations > 0 and page.typeset_from_disk == page.equations, page.page
            assert page.figures > 0, page.page
            assert page.collapsed > 0, page.page


def test_search_finds_alibi(report):
    assert any("07_alibi" in href for href in report.search_results), report.search_results


def test_notebook_download_link_returns_the_chapter(report):
    download = report.notebook_download
    assert download["status"] == 200 and download["nbformat"] == 4, download
    assert download["same_cells_as_source"], download


def test_full_page_screenshots_are_saved(report):
    assert len(report.screenshots) == len(book_browser.SCREENSHOT_PAGES)
    for shot in report.screenshots:
        assert Path(shot).stat().st_size > 50_000, shot
