"""Helpers for running the book's chapters as notebooks, with or without the book toolchain.

The chapters put computed numbers and figures into the prose with MyST-NB's ``glue``. A learner
who opens a chapter in plain Jupyter or Colab may not have MyST-NB installed; :func:`glue` then
simply displays the value, so every number and figure is still visible.
"""

from __future__ import annotations

import math
from typing import Any, Optional


class _Text:
    """A string whose plain-text display is the string itself (no quotes)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store ``value`` under ``name`` for ``{glue:}`` / ``{glue:figure}`` in the book.

    With MyST-NB installed this is ``myst_nb.glue`` (by default not displayed in the cell, since
    the prose shows it). Without it, the value is displayed in the cell output instead. Strings
    are shown without quotes. A matplotlib figure is closed afterwards so that Jupyter's inline
    backend does not draw it a second time. Returns ``None``, so a cell ending in ``glue(...)``
    has no stray output.

    Args:
        name: key referenced from the Markdown, e.g. ``{glue:}`name```.
        value: a number, string or matplotlib figure.
        display: also display the value in the cell output when MyST-NB is installed.

    Raises:
        ValueError: if ``name`` is empty or contains whitespace.
    """
    if not isinstance(name, str) or not name or any(ch.isspace() for ch in name):
        raise ValueError(f"name must be a non-empty string without whitespace, got {name!r}")
    shown = _Text(value) if isinstance(value, str) else value
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        myst_glue = None
    if myst_glue is not None:
        myst_glue(name, shown, display=display)
    else:
        from IPython.display import display as ipy_display

        ipy_display(shown)
    if type(value).__name__ == "Figure" and type(value).__module__.startswith("matplotlib"):
        import matplotlib.pyplot as plt

        plt.close(value)


def claims_table(path: str | None = None, prefix: str = "", full: bool = False):
    """The claims ledger (``book/claims.yml``) as a Markdown table, optionally only ids starting with ``prefix``.

    A chapter ends with its compact table (``full=False``): the claim, the verdict, the entry's
    one-line ``reason`` and where the book checks it. The ledger page shows every entry with its
    whole ``note`` (``full=True``). Evidence is rendered for a reader: a notebook cell
    (``book/x.ipynb#tag``) becomes a link to the labelled section holding it, with the label of its
    collapsed check when it has one; a test (``tests/x.py::name``) is named by file and function.

    Args:
        path: the ledger file; default ``claims.yml`` in the working directory (a chapter run from
            ``book/``) or else ``book/claims.yml`` (run from the repository root). Evidence paths
            are relative to the ledger's grandparent (the repository root).
        prefix: keep only entries whose ``id`` starts with it, e.g. ``"ch01-"``.
        full: show the whole note ("What is true") instead of the one-line reason.

    Returns:
        An ``IPython.display.Markdown`` object (rendered by Jupyter and by the book).

    Raises:
        FileNotFoundError: if no ledger is found.
        ValueError: if no entry matches ``prefix``, or an evidence reference cannot be resolved
            (an unknown notebook or tag, or a cell under no labelled section).
    """
    from pathlib import Path

    import yaml
    from IPython.display import Markdown

    candidates = [Path(path)] if path else [Path("claims.yml"), Path("book") / "claims.yml"]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise FileNotFoundError(f"no claims ledger at {', '.join(map(str, candidates))}")
    entries = [e for e in yaml.safe_load(found.read_text(encoding="utf-8")) if e["id"].startswith(prefix)]
    if not entries:
        raise ValueError(f"no claim id starts with prefix={prefix!r} in {found}")
    root = found.resolve().parent.parent

    rows = [
        f"| Claim (source, ledger id) | Verdict | {'What is true' if full else 'Why'} | Where the book checks it |",
        "| --- | --- | --- | --- |",
    ]
    for e in entries:
        evidence = e["evidence"] if isinstance(e["evidence"], list) else [e["evidence"]]
        refs = "; ".join(dict.fromkeys(evidence_anchor(ref, root) for ref in evidence))  # each link once
        why = e["note"] if full else e["reason"]
        rows.append(
            f"| {_cell_text(e['claim'])} ({_cell_text(e['source'])}, `{e['id']}`) | **{e['verdict']}** | {_cell_text(why)} | {refs} |"
        )
    return Markdown("\n".join(rows))


def evidence_anchor(ref: str, root) -> str:
    """A ledger evidence reference as a reader sees it (MyST Markdown).

    ``book/01_why_position.ipynb#tag`` becomes ``ch. 1, {ref}`sec-label``` (the last section label
    ``(sec-label)=`` before the tagged cell), followed by the cell's collapsed-check label
    (``mystnb.code_prompt_show``) in quotes when it has one; ``tests/test_x.py::test_y`` becomes
    ``test `test_x.py::test_y```.

    Args:
        ref: the evidence reference from ``book/claims.yml``.
        root: the repository root (a ``pathlib.Path``) the reference is relative to.

    Raises:
        ValueError: if the notebook, the tag or a section label before the cell is missing, or
            ``ref`` is neither form.
    """
    import json
    import re
    from pathlib import PurePosixPath

    if "::" in ref:
        return f"test `{PurePosixPath(ref).name}`"
    path, sep, tag = ref.partition(".ipynb#")
    if not sep or not tag:
        raise ValueError(f"ref must be 'tests/x.py::test' or 'book/x.ipynb#tag', got {ref!r}")
    file = root / (path + ".ipynb")
    if not file.is_file():
        raise ValueError(f"evidence {ref!r}: no notebook {file}")
    cells = json.loads(file.read_text(encoding="utf-8"))["cells"]
    index = next((i for i, c in enumerate(cells) if tag in c.get("metadata", {}).get("tags", [])), None)
    if index is None:
        raise ValueError(f"evidence {ref!r}: no cell of {file.name} is tagged {tag!r}")
    labels = [
        label
        for c in cells[: index + 1]
        if c["cell_type"] == "markdown"
        for label in re.findall(r"^\(([A-Za-z0-9_-]+)\)=\s*$", "".join(c["source"]), re.M)
    ]
    if not labels:
        raise ValueError(f"evidence {ref!r}: no section label '(name)=' before the tagged cell in {file.name}")
    number = re.match(r"(\d+)_", file.name)
    where = f"ch. {int(number[1])}, " if number else ""
    prompt = cells[index].get("metadata", {}).get("mystnb", {}).get("code_prompt_show", "")
    check = f" (“{_cell_text(prompt)}”)" if prompt else ""
    return f"{where}{{ref}}`{labels[-1]}`{check}"


def _cell_text(text: str) -> str:
    """``text`` on one line, safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def range_text(values, fmt: str = ".2f") -> str:
    """The range of ``values`` as text for the prose: ``"lo–hi"``, or one number when both ends print alike.

    Each end is formatted with ``format(x, fmt)`` (e.g. ``".2f"``, ``".0%"``, ``","``), so two values
    that differ only beyond the printed digits read as one number, never as ``"1.50–1.50"``.

    Args:
        values: numbers (a list, or a tensor or array of any shape); integers stay integers, so
            ``fmt=","`` prints ``"1,500"``.
        fmt: a format specification for each end.

    Raises:
        ValueError: if ``values`` is empty.
    """
    flat = values.reshape(-1).tolist() if hasattr(values, "reshape") else list(values)
    if not flat:
        raise ValueError("values must not be empty")
    lo, hi = format(min(flat), fmt), format(max(flat), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def time_ms(fn, repeats: int = 7, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in milliseconds, for the small live measurements in chapters.

    Runs ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; when CUDA is initialised the
    device is synchronised around each call so that queued kernels are counted. For numbers the
    book reports, use the scripts in ``benchmarks/`` instead.

    Raises:
        ValueError: if ``repeats < 1`` or ``warmup < 0``.
    """
    import statistics
    import time

    import torch

    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def stored_study(name: str, root: str | None = None) -> dict:
    """A stored study from ``book/results/NAME.json`` (written by :mod:`posenc.lab.experiments.compare`).

    Args:
        name: the study's name, e.g. ``"methods"``.
        root: the repository root; by default found from this file (source checkout) or the
            current directory (a chapter run from ``book/``).

    Raises:
        FileNotFoundError: if the file is not found, with the command that makes it.
    """
    import json
    from pathlib import Path

    candidates = [Path(root)] if root else [Path(__file__).resolve().parents[2], Path.cwd().parent, Path.cwd()]
    for base in candidates:
        path = base / "book" / "results" / f"{name}.json"
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError(f"no stored study {name!r} under {[str(c) for c in candidates]}; "
                            f"make it with: python -m posenc.lab.experiments.compare {name}")


def separated(a: dict, b: dict) -> bool:
    """Whether two summaries of :func:`posenc.lab.experiments.compare.summarize` do not overlap.

    True when every seed of one lies beyond every seed of the other (``a["max"] < b["min"]`` or
    the reverse): the rule of the pre-protocol chapters, a rank test that calls identical methods
    different 10 % of the time with three seeds each. Chapters moved to the experiments protocol use
    :func:`protocol_separated` instead.
    """
    return a["max"] < b["min"] or b["max"] < a["min"]


def study_table(columns: dict[str, dict[str, dict]], order: list[str], digits: dict[str, int] | None = None,
                extra: dict[str, dict[str, str]] | None = None):
    """A Markdown table of mean ± standard deviation [min, max] per arm, one column per metric.

    Args:
        columns: ``{column title: summary}``, each summary from ``summarize``.
        order: the arms, in row order.
        digits: decimals per column title (default 3).
        extra: more columns, ``{column title: {arm: text}}``, after the metrics.
    """
    from IPython.display import Markdown

    digits, extra = digits or {}, extra or {}
    head = "| | " + " | ".join([*columns, *extra]) + " |"
    rows = [head, "|" + " --- |" * (len(columns) + len(extra) + 1)]
    for arm in order:
        cells = []
        for title, summary in columns.items():
            s, d = summary.get(arm), digits.get(title, 3)
            cells.append("–" if s is None else f"{s['mean']:.{d}f} ± {s['std']:.{d}f} [{s['min']:.{d}f}, {s['max']:.{d}f}]")
        cells += [texts.get(arm, "–") for texts in extra.values()]
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    return Markdown("\n".join(rows))


def plot_seeds(ax, summary: dict[str, dict], order: list[str], *, live: dict[str, float] | None = None,
               label: str = "stored, one dot per seed"):
    """Dots for every seed of every arm, a bar at the mean, and optionally the live run's value.

    Args:
        ax: a matplotlib axis; arms go on the y axis.
        summary: from ``summarize``.
        order: the arms, top to bottom.
        live: ``{arm: value}`` of the chapter's live run, drawn as open diamonds.
    """
    for y, arm in enumerate(order):
        s = summary[arm]
        ax.scatter(s["values"], [y] * len(s["values"]), s=18, color="C0", alpha=0.7, label=label if y == 0 else None)
        ax.plot([s["mean"]] * 2, [y - 0.3, y + 0.3], color="C0", lw=2)
        if live and arm in live:
            ax.scatter([live[arm]], [y], s=60, facecolors="none", edgecolors="C3", marker="D",
                       label="live run (this notebook)" if arm == next(a for a in order if a in live) else None)
    ax.set_yticks(range(len(order)), order)
    ax.invert_yaxis()
    return ax


#: The metrics that are fractions of items right; :func:`protocol_summary` clips their intervals to ``[0, 1]``.
FRACTIONS = frozenset({"token_accuracy", "exact_match"})


#: Where a protocol record keeps the per-item scores behind a metric (for the evaluation half-width),
#: the validation windows of ``val_loss``, the copy examples of ``exact_match``, and the 128 windows of
#: each reading of the tables study (``inside``, ``outside``, ``control.NAME`` in ``per_window.NAME``).
ITEMS = {"val_loss": "loss_per_window", "exact_match": "row_exact", "inside": "per_window.inside",
         "outside": "per_window.outside"}


def _items_path(metric: str) -> Optional[str]:
    if metric in ITEMS:
        return ITEMS[metric]
    if metric.startswith("control."):
        return "per_window." + metric.split(".", 1)[1]
    return None


def protocol_summary(records: list[dict], study, metric, setting: str, *, role: str = "tuned",
                     items=None) -> dict[str, dict]:
    """Per arm of a protocol study: the seeds' values of ``metric`` in ``setting``, their mean with
    its 95 % interval over seeds, and the evaluation-sample half-width (bootstrap over each seed's
    windows or examples, Wilson's interval for 0/1 items).

    Args:
        records: the stored records (``stored_study("protocol/NAME")["records"]``).
        study: the :class:`~posenc.lab.experiments.compare.Study` (for the tuning seed and choices).
        metric: a key of the records, dotted for a nested one (``"val_loss"``, ``"exact_match"``,
            ``"control.long"``, ``"trained_rows.eff99"``), or a function of one record that returns a
            number, or ``None`` where the record has none (a reading derived from several keys).
        setting: ``"lm"`` or ``"copy"``.
        role: ``"tuned"`` (each arm at its chosen multiplier) or ``"untuned"`` (multiplier 1).
        items: the per-item scores behind the metric, as a dotted key or a function of one record that
            returns a list (e.g. per-window differences of two readings of one model); by default
            :data:`ITEMS` for a named metric, none for a function.

    Returns:
        ``{arm: {"values", "seeds", "mean", "low", "high", "n", "eval", "mult"}}`` in the order the arms
        first appear, for the arms whose records hold the metric; ``values`` in the order of ``seeds``;
        ``eval`` is ``None`` for a metric without per-item scores, ``mult`` the multiplier. For a
        fraction (:data:`FRACTIONS`) the interval is clipped to ``[0, 1]``: the t interval of three
        seeds that spread widely can reach past 1. Tests of separation use ``values``, never the
        clipped interval.

    Raises:
        TypeError: if ``metric`` or ``items`` is neither a string nor callable.
    """
    from posenc.lab.experiments.compare import _lookup, select
    from posenc.lab.experiments.stats import eval_half_width, seed_interval

    for name, arg in (("metric", metric), ("items", items)):
        if not (isinstance(arg, str) or callable(arg) or (name == "items" and arg is None)):
            raise TypeError(f"{name} must be a dotted key or a function of a record, got {type(arg).__name__}")
    if items is None and isinstance(metric, str):
        items = _items_path(metric)
    read = metric if callable(metric) else (lambda r: _lookup(r, metric))
    read_items = items if callable(items) or items is None else (lambda r: _lookup(r, items))
    out: dict[str, dict] = {}
    rows: dict[str, list[tuple[dict, float]]] = {}
    for r in select(records, study, role):
        if r["setting"] == setting and (v := read(r)) is not None:
            rows.setdefault(r["arm"], []).append((r, float(v)))
    for arm, pairs in rows.items():
        pairs = sorted(pairs, key=lambda p: p[0]["seed"])
        rs, values = [p[0] for p in pairs], [p[1] for p in pairs]
        iv = seed_interval(values) if len(values) > 1 else None
        per = [read_items(r) for r in rs] if read_items is not None else None
        ev = None
        if per and all(p is not None for p in per):
            # one model's 0/1 items are a proportion; differences of readings never are
            ev = eval_half_width([[float(c) for c in p] for p in per], proportions=None if isinstance(items, str) else False)
        low, high = (iv.low, iv.high) if iv else (math.nan, math.nan)
        if iv and metric in FRACTIONS:
            low, high = max(low, 0.0), min(high, 1.0)
        out[arm] = {"values": values, "seeds": [r["seed"] for r in rs], "mean": sum(values) / len(values), "low": low,
                    "high": high, "n": len(values), "eval": ev, "mult": rs[0].get("mult", 1.0)}
    return out


def protocol_separated(a: dict, b: dict, *, paired: bool = False, first: int = 3) -> bool:
    """Whether two arms of :func:`protocol_summary` are separated, by the protocol's rule
    (:func:`posenc.lab.experiments.stats.two_looks`: the ``first`` seeds the study planned (three),
    then five where the margin asks for them; :func:`posenc.lab.experiments.stats.separated` at
    each look)."""
    return protocol_decision(a, b, paired=paired, first=first)["separated"]


def protocol_decision(a: dict, b: dict, *, paired: bool = False, first: int = 3) -> dict:
    """:func:`posenc.lab.experiments.stats.two_looks` for two arms of :func:`protocol_summary`
    (``first``: the seeds the study planned, e.g. ``len(study.seeds)``): ``{"separated", "seeds",
    "pending"}``.

    Raises:
        ValueError: if an arm's seeds are not ``0, 1, 2, ...`` in order (the looks take the first
            seeds of each).
    """
    from posenc.lab.experiments.stats import two_looks

    for name, arm in (("a", a), ("b", b)):
        if "seeds" in arm and list(arm["seeds"]) != list(range(len(arm["seeds"]))):
            raise ValueError(f"{name} must hold seeds 0, 1, 2, ... in order, got seeds {arm['seeds']}")
    return two_looks(a["values"], b["values"], paired=paired, first=first)


def glue_rerun(prefix: str, checks) -> None:
    """Glue what live reruns of stored runs found (:func:`posenc.lab.experiments.records.check_rerun`),
    for a chapter's text: ``PREFIX-diff``, the largest difference of the final values (``"0"`` when
    exact); ``PREFIX-early``, the largest difference of the training losses over the first steps;
    ``PREFIX-processor``, "the kind of processor that made the stored runs" or "another kind of
    processor than the one that made the stored runs".

    Args:
        prefix: the glue names' prefix.
        checks: the :class:`~posenc.lab.experiments.records.Rerun` results (at least one).

    Raises:
        ValueError: if ``checks`` is empty.
    """
    checks = list(checks)
    if not checks:
        raise ValueError("checks must hold at least one Rerun, got none")
    gap, early = max(c.gap for c in checks), max(c.early_gap for c in checks)
    glue(f"{prefix}-diff", "0" if gap == 0 else f"{gap:.0e}")
    glue(f"{prefix}-early", "0" if early == 0 else f"{early:.0e}")
    glue(f"{prefix}-processor", "the kind of processor that made the stored runs" if all(c.same_processor for c in checks)
         else "another kind of processor than the one that made the stored runs")


def interval_text(summary: dict, digits: int = 3) -> str:
    """``"mean [low, high]"``: a summary of :func:`protocol_summary` with its 95 % interval over seeds."""
    d = digits
    return f"{summary['mean']:.{d}f} [{summary['low']:.{d}f}, {summary['high']:.{d}f}]"


def protocol_table(columns: dict[str, dict[str, dict]], order: list[str], digits: dict[str, int] | None = None,
                   extra: dict[str, dict[str, str]] | None = None):
    """A Markdown table of ``mean [95 % interval over seeds] ± evaluation half-width`` per arm, one
    column per summary of :func:`protocol_summary`, then the ``extra`` columns."""
    from IPython.display import Markdown

    digits, extra = digits or {}, extra or {}
    rows = ["| | " + " | ".join([*columns, *extra]) + " |", "|" + " --- |" * (len(columns) + len(extra) + 1)]
    for arm in order:
        cells = []
        for title, summary in columns.items():
            s, d = summary.get(arm), digits.get(title, 3)
            if s is None:
                cells.append("–")
                continue
            cells.append(interval_text(s, d) + (f" ± {s['eval']:.{d}f}" if s["eval"] is not None else ""))
        cells += [texts.get(arm, "–") for texts in extra.values()]
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    return Markdown("\n".join(rows))


def plot_intervals(ax, summary: dict[str, dict], order: list[str], *, untuned: dict[str, dict] | None = None,
                   live: dict[str, float] | None = None, label: str = "tuned, one dot per seed"):
    """Each arm's seeds (dots), their mean with its 95 % interval (bar), optionally the untuned mean
    (a hollow circle, where the arm was tuned to another multiplier) and a live run (open diamond).

    Args:
        ax: a matplotlib axis; arms go on the y axis, top to bottom in ``order``.
        summary: from :func:`protocol_summary` (``role="tuned"``).
        order: the arms to draw.
        untuned: from :func:`protocol_summary` with ``role="untuned"``.
        live: ``{arm: value}`` of the chapter's live run.
    """
    first_untuned = True
    for y, arm in enumerate(order):
        s = summary[arm]
        ax.scatter(s["values"], [y] * len(s["values"]), s=16, color="C0", alpha=0.6, label=label if y == 0 else None)
        ax.errorbar([s["mean"]], [y], xerr=[[s["mean"] - s["low"]], [s["high"] - s["mean"]]], fmt="|", color="C0",
                    ms=14, capsize=3, label="mean, 95 % interval over seeds" if y == 0 else None)
        if untuned and arm in untuned and untuned[arm]["mult"] != s["mult"]:
            ax.scatter([untuned[arm]["mean"]], [y + 0.28], s=28, facecolors="none", edgecolors="C1",
                       label="untuned (multiplier 1), mean" if first_untuned else None)
            first_untuned = False
        if live and arm in live:
            ax.scatter([live[arm]], [y], s=60, facecolors="none", edgecolors="C3", marker="D",
                       label="live run (this notebook)" if arm == next(a for a in order if a in live) else None)
    ax.set_yticks(range(len(order)), order)
    ax.set_ylim(len(order) - 0.5, -0.5)
    return ax


def plot_curves(ax, records: list[dict], study, setting: str, metric: str, arms: list[str], *, role: str = "tuned"):
    """The learning curve of ``metric`` (mean over the reported seeds, with their range shaded) for
    each arm of a protocol study.

    Args:
        ax: a matplotlib axis.
        records: the stored records.
        study: the :class:`~posenc.lab.experiments.compare.Study`.
        setting: ``"lm"`` or ``"copy"``.
        metric: a key of the curve points (``"val_loss"``, ``"exact_match"``, ...).
        arms: the arms to draw, in legend order.
        role: ``"tuned"`` or ``"untuned"``.
    """
    from posenc.lab.experiments.compare import select

    chosen = [r for r in select(records, study, role) if r["setting"] == setting and "curve" in r]
    for i, arm in enumerate(arms):
        curves = [r["curve"] for r in sorted(chosen, key=lambda r: r["seed"]) if r["arm"] == arm]
        if not curves:
            continue
        steps = [p["step"] for p in curves[0]]
        values = [[c[k][metric] for c in curves] for k in range(len(steps))]
        mean = [sum(v) / len(v) for v in values]
        ax.plot(steps, mean, "-", color=f"C{i % 10}", label=arm)
        ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=f"C{i % 10}", alpha=0.15)
    ax.set_xlabel("step")
    return ax
