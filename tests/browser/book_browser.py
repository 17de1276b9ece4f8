"""Read the built HTML book as a reader does: in a real headless Chromium, with the network off.

Every page of ``_build/html`` is loaded from a server on 127.0.0.1 while every request to any other
host is refused (and reported), and every page with mathematics is also opened from disk
(``file://``), as a reader without network opens the built book. For each page it records console
errors and uncaught exceptions, requests that tried to leave the machine, equations found and
equations MathJax typeset (and MathJax errors), figures and whether each one loaded with content,
raw TeX left in the text, code blocks wider than their column, glued outputs shown twice, and the
set-up and verification cells a reader must not see in full. It also runs the book's search for
"ALiBi", downloads a chapter's notebook through the page's download link, and saves full-page
screenshots of two chapters, plus the README's small screenshot when asked.

Usage (Chromium from Debian's ``chromium`` package; ``make test`` runs it through pytest)::

    python tests/browser/book_browser.py [--html _build/html] [--out _build/browser]
                                         [--readme-screenshot book/images/book-screenshot.png]

Prints the per-page table; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
# The two chapters shown in full-page screenshots, and the page of the README's screenshot.
SCREENSHOT_PAGES = ("book/06_rope.html", "book/07_alibi.html")
README_PAGE, README_ANCHOR = "book/06_rope.html", "sec-rope-requirement"
# Chromium without a network: no host name resolves except the local server's address, and none of
# the background services that call home at start.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]

# Runs in the page after MathJax has finished; returns what the checks need.
INSPECT_JS = r"""
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const main = document.querySelector('main') || document.body;
  const math = [...document.querySelectorAll('.math')];
  const untypeset = math.filter(el => !el.querySelector('mjx-container')).map(el => el.textContent.slice(0, 80));
  const merrors = [...document.querySelectorAll('mjx-merror')].map(el => el.textContent.slice(0, 80));

  // Text a reader sees outside code and typeset math.
  const skip = new Set(['PRE', 'CODE', 'SCRIPT', 'STYLE', 'TEXTAREA', 'MJX-CONTAINER', 'MJX-ASSISTIVE-MML']);
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT, {acceptNode: node => {
    for (let el = node.parentElement; el && el !== main; el = el.parentElement) {
      if (skip.has(el.tagName) || el.classList.contains('highlight')) return NodeFilter.FILTER_REJECT;
    }
    return NodeFilter.FILTER_ACCEPT;
  }});
  const rawTex = [];
  const texPattern = /\\\(|\\\)|\\\[|\\\]|\$\$|\\(frac|mathbb|mathrm|operatorname|sqrt|sum|theta|alpha|cdot|left|right|begin)\b/;
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const m = n.textContent.match(texPattern);
    if (m) rawTex.push(n.textContent.trim().slice(0, 100));
  }

  const norm0 = s => s.replace(/\s+/g, ' ').trim().slice(0, 60);
  // Figures: every image in the content loaded, with a size and more than one colour.
  const figures = [];
  for (const img of main.querySelectorAll('img')) {
    const info = {src: img.getAttribute('src').slice(0, 120), loaded: img.complete && img.naturalWidth > 0,
                  width: img.naturalWidth, height: img.naturalHeight, colours: 0};
    if (info.loaded) {
      try {
        const c = document.createElement('canvas');
        c.width = Math.min(img.naturalWidth, 400); c.height = Math.min(img.naturalHeight, 400);
        const ctx = c.getContext('2d');
        ctx.drawImage(img, 0, 0, c.width, c.height);
        const d = ctx.getImageData(0, 0, c.width, c.height).data;
        const seen = new Set();
        for (let i = 0; i < d.length && seen.size < 3; i += 4 * 7) seen.add(d[i] + ',' + d[i+1] + ',' + d[i+2] + ',' + d[i+3]);
        info.colours = seen.size;
      } catch (e) { info.colours = -1; }   // a tainted canvas (file:// pages): loaded is what counts
    }
    figures.push(info);
  }

  const emptyFigures = [...main.querySelectorAll('figure')].filter(f => !f.querySelector('img')).map(f => f.id || norm0(f.textContent));

  // Code that runs past its column (cut off or scrolled), and a page wider than the window.
  const wideCode = [...main.querySelectorAll('pre')]
    .filter(pre => pre.offsetParent !== null && pre.scrollWidth > pre.clientWidth + 1)
    .map(pre => pre.textContent.split('\n').sort((a, b) => b.length - a.length)[0].slice(0, 80));
  const pageOverflow = document.documentElement.scrollWidth > window.innerWidth + 1;

  // A glued output shown twice: in the output of the cell that made it, and pasted into the prose.
  const norm = s => s.replace(/\s+/g, ' ').trim();
  const inCell = el => el.closest('.cell_output') !== null;
  const outputTables = new Set([...main.querySelectorAll('.cell_output table')].map(t => norm(t.textContent)));
  const outputImages = new Set([...main.querySelectorAll('.cell_output img')].map(i => i.getAttribute('src')));
  const shownTwice = [
    ...[...main.querySelectorAll('table')].filter(t => !inCell(t) && outputTables.has(norm(t.textContent)))
      .map(t => 'table: ' + norm(t.textContent).slice(0, 60)),
    ...[...main.querySelectorAll('img')].filter(i => !inCell(i) && outputImages.has(i.getAttribute('src')))
      .map(i => 'figure: ' + i.getAttribute('src')),
  ];

  // Code cells: visible sources, and the collapsed ones with their captions.
  const cells = [...main.querySelectorAll('.cell')];
  const visibleSetup = cells.filter(c => {
    const src = c.querySelector('.cell_input');
    return src && src.offsetParent !== null && /sys\.path\.insert/.test(src.textContent);
  }).length;
  const collapsed = [...main.querySelectorAll('.cell details.hide')].map(d => ({
    caption: norm(d.querySelector('summary') ? d.querySelector('summary').textContent : ''),
    open: d.open,
  }));
  return {title: document.title, equations: math.length, untypeset, merrors, rawTex, figures, emptyFigures, wideCode,
          pageOverflow, shownTwice, cells: cells.length, visibleSetup, collapsed};
}
"""


@dataclass
class PageResult:
    """What one page showed."""

    page: str
    title: str = ""
    equations: int = 0
    typeset: int = 0
    typeset_from_disk: int | None = None  # equations typeset when opened from file:// (pages with math)
    figures: int = 0
    figures_ok: int = 0
    console_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cells: int = 0
    collapsed: int = 0

    @property
    def ok(self) -> bool:
        return not (self.console_errors or self.external_requests or self.failed_requests or self.problems)


@dataclass
class Report:
    """Every page's result, and the book-wide checks."""

    pages: list[PageResult]
    search_results: list[str] = field(default_factory=list)
    notebook_download: dict = field(default_factory=dict)
    screenshots: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.ok for p in self.pages)

    def table(self) -> str:
        """The per-page table, as Markdown."""
        rows = [
            "| page | equations typeset | from disk | figures (with content) | console errors | outside requests | problems |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for p in self.pages:
            disk = "" if p.typeset_from_disk is None else f"{p.typeset_from_disk}/{p.equations}"
            rows.append(
                f"| {p.page} | {p.typeset}/{p.equations} | {disk} | {p.figures_ok}/{p.figures} | "
                f"{len(p.console_errors)} | {len(p.external_requests)} | {'; '.join(p.problems) or '-'} |"
            )
        return "\n".join(rows)


def pages_of(html: Path) -> list[str]:
    """Every HTML page of the build, relative to its root (assets under ``_static`` excluded)."""
    return sorted(
        str(p.relative_to(html)) for p in html.rglob("*.html") if not p.relative_to(html).parts[0].startswith("_static")
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(html: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``html`` on a free port of 127.0.0.1; returns the server and its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def browser_available() -> str | None:
    """``None`` when the check can run here, else why not."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package 'playwright' is not installed (pip install -r requirements.txt)"
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    return None


def _forwards_to(path: Path) -> str | None:
    """The target of a page that only forwards (a meta refresh), else ``None``."""
    match = re.search(r'http-equiv="refresh" content="\d+; ?url=([^"]+)"', path.read_text(encoding="utf-8"), re.I)
    return match.group(1) if match else None


def _evaluate_after_load(page, url: str) -> dict:
    """Open ``url`` and run :data:`INSPECT_JS` on it once it has loaded."""
    page.goto(url, wait_until="load")
    return page.evaluate(INSPECT_JS)


def _inspect(page, url: str, result: PageResult, from_disk: bool = False) -> dict:
    found = _evaluate_after_load(page, url)
    typeset = found["equations"] - len(found["untypeset"])
    if from_disk:
        result.typeset_from_disk = typeset
        if found["untypeset"] or found["merrors"]:
            result.problems.append(f"from disk: {len(found['untypeset'])} equations not typeset")
        return found
    result.title, result.equations, result.typeset = found["title"], found["equations"], typeset
    result.cells, result.collapsed = found["cells"], len(found["collapsed"])
    result.figures = len(found["figures"])
    result.figures_ok = sum(f["loaded"] and f["width"] > 1 and f["height"] > 1 and f["colours"] != 1 for f in found["figures"])
    checks = [
        (found["untypeset"], "equations not typeset"),
        (found["merrors"], "MathJax errors"),
        (found["rawTex"], "raw TeX in the text"),
        (found["wideCode"], "code wider than its column"),
        (found["shownTwice"], "glued output shown twice"),
        (found["emptyFigures"], "figures without an image"),
        ([c for c in found["collapsed"] if c["open"] or not c["caption"].startswith("Check:")], "collapsed cells without a 'Check:' caption, or open"),
    ]
    for items, what in checks:
        if items:
            result.problems.append(f"{what}: {items[:3]}")
    if result.figures_ok < result.figures:
        result.problems.append(f"{result.figures - result.figures_ok} figures missing or empty")
    if found["pageOverflow"]:
        result.problems.append("the page is wider than the window")
    if found["visibleSetup"]:
        result.problems.append("a set-up cell (sys.path) is shown")
    return found


def check_book(html: Path, out: Path, readme_screenshot: Path | None = None) -> Report:
    """Load every page of the build at ``html`` in headless Chromium; screenshots go to ``out``."""
    from playwright.sync_api import sync_playwright

    html, out = Path(html).resolve(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    server, base = serve(html)
    report = Report(pages=[])
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            current: list[PageResult] = []

            def route(r):
                url = r.request.url
                if url.startswith(base) or url.startswith("file://") or url.startswith("data:") or url.startswith("blob:"):
                    r.continue_()
                else:
                    current[-1].external_requests.append(url[:120])
                    r.abort()

            context.route("**/*", route)
            page = context.new_page()
            page.on("console", lambda m: m.type == "error" and current[-1].console_errors.append(m.text[:200]))
            page.on("pageerror", lambda e: current[-1].console_errors.append(f"uncaught: {str(e)[:200]}"))
            page.on(
                "requestfailed",
                lambda r: urlsplit(r.url).hostname == "127.0.0.1" and current[-1].failed_requests.append(r.url[:120]),
            )
            for name in pages_of(html):
                result = PageResult(page=name)
                current.append(result)
                report.pages.append(result)
                target = _forwards_to(html / name)
                if target is not None:  # index.html: a meta refresh to the first page
                    result.title = f"forwards to {target}"
                    if not (html / name).parent.joinpath(target).is_file():
                        result.problems.append(f"forwards to a missing page {target}")
                    continue
                _inspect(page, base + name, result)
                if result.equations:
                    _inspect(page, (html / name).as_uri(), result, from_disk=True)
                if name in SCREENSHOT_PAGES:
                    _evaluate_after_load(page, base + name)
                    shot = out / (Path(name).stem + ".png")
                    page.screenshot(path=str(shot), full_page=True)
                    report.screenshots.append(str(shot))

            # The search page, as a reader uses it.
            search = PageResult(page="search.html?q=ALiBi")
            current.append(search)
            page.goto(base + "search.html?q=ALiBi", wait_until="load")
            page.wait_for_selector("#search-results ul.search li", timeout=20000)
            report.search_results = page.eval_on_selector_all(
                "#search-results ul.search li a", "els => els.map(a => a.getAttribute('href'))"
            )
            if not any("07_alibi" in href for href in report.search_results):
                report.problems.append(f"search for 'ALiBi' does not find the ALiBi chapter: {report.search_results[:5]}")
            if not search.ok:
                report.problems.append(f"search page: {search.console_errors + search.external_requests}")

            # A chapter's notebook, through the download link a reader clicks.
            page.goto(base + "book/07_alibi.html", wait_until="load")
            link = page.query_selector("a[href$='.ipynb']")
            href = link.get_attribute("href") if link else None
            response = context.request.get(base + "book/" + href) if href else None
            download = {"href": href, "status": response.status if response else None}
            if response is not None and response.ok:
                notebook = json.loads(response.body())
                source = json.loads((ROOT / "book" / "07_alibi.ipynb").read_text(encoding="utf-8"))
                download["cells"] = len(notebook["cells"])
                download["same_cells_as_source"] = [c["source"] for c in notebook["cells"]] == [c["source"] for c in source["cells"]]
                download["nbformat"] = notebook.get("nbformat")
            report.notebook_download = download
            if not download.get("same_cells_as_source"):
                report.problems.append(f"the chapter's notebook download failed or differs from book/07_alibi.ipynb: {download}")

            if readme_screenshot is not None:
                _readme_screenshot(context, base + README_PAGE, Path(readme_screenshot))
            browser.close()
    finally:
        server.shutdown()
    return report


def _readme_screenshot(context, url: str, target: Path) -> None:
    """A small picture of a chapter (a derivation with its equations) for the README."""
    page = context.new_page()
    page.set_viewport_size({"width": 1100, "height": 720})
    _evaluate_after_load(page, url)
    page.evaluate(f"() => document.getElementById('{README_ANCHOR}').scrollIntoView()")
    page.wait_for_timeout(300)
    raw = target.with_suffix(".raw.png")
    page.screenshot(path=str(raw))
    page.close()
    from PIL import Image  # matplotlib's dependency: reduce to a palette so the committed PNG stays small

    with Image.open(raw) as img:
        img.convert("RGB").quantize(colors=64).save(target, optimize=True)
    raw.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "html", help="the built book")
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "browser", help="screenshots and report.json")
    parser.add_argument("--readme-screenshot", type=Path, default=None, help="also write the README's screenshot here")
    args = parser.parse_args(argv)
    why = browser_available()
    if why:
        print(f"book_browser: cannot run: {why}", file=sys.stderr)
        return 2
    if not (args.html / "index.html").is_file():
        print(f"book_browser: no built book at {args.html} (run make book)", file=sys.stderr)
        return 2
    report = check_book(args.html, args.out, args.readme_screenshot)
    (args.out / "report.json").write_text(json.dumps(asdict(report), indent=1))
    print(report.table())
    print(f"\nsearch 'ALiBi': {len(report.search_results)} results; notebook download: {report.notebook_download}")
    print("screenshots:", ", ".join(report.screenshots))
    for problem in report.problems:
        print("PROBLEM:", problem)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
