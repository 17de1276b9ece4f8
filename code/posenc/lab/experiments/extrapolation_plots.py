"""Figures of the length-extrapolation study (:mod:`posenc.lab.experiments.extrapolation`), from its stored JSON.

:func:`per_seed` collects the evaluation records seed by seed and :func:`summarize` reduces them
(mean, min, max); the three figures are the loss at every position at the longest length
(:func:`loss_vs_position_figure`), the loss and the passkey accuracy against the evaluation length
(:func:`length_sweep_figure`, with an optional overlay of a live run) and the passkey accuracy at
every (length, depth) (:func:`passkey_grid_figure`). Each returns the figure (chapter 8 draws them
from the stored study); ``plot_*`` save them as PNG files (the runner's ``--plots``). Every curve is a
mean over seeds with the range over seeds as a band or error bar. matplotlib is imported only when
a figure is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np


def variant_label(record: dict) -> str:
    """How a record's model is named in the figures: ``"rope"``, ``"alibi + log-n"``,
    ``"rope, yarn zero-shot"``, ``"rope, linear fine-tuned"``, ``"rope, unscaled fine-tuned"`` (the
    control: fine-tuned with RoPE's own frequencies, ``finetune = "default"``), ``"alibi, shifted 896"``
    (rows of ``L`` read at ``position_offset`` 896, the protocol's control of the passkey)."""
    label = record["method"]
    if record.get("position_offset"):
        label += f", shifted {record['position_offset']}"
    if record.get("finetune"):
        label += f", {'unscaled' if record['finetune'] == 'default' else record['finetune']} fine-tuned"
    elif record.get("scaling", "none") != "none":
        label += f", {record['scaling']} zero-shot"
    if record.get("logn"):
        label += " + log-n"
    return label


def per_seed(records: Sequence[dict], task: str, metric: str, *, over_depths: bool = False) -> dict[str, dict]:
    """``metric`` of every model variant and evaluation point, seed by seed (for paired comparisons).

    Args: as :func:`summarize`.

    Returns:
        ``{label: {(eval_length, depth): {seed: value}}}``; ``value`` is a float or, for
        ``"loss_per_position"``, a ``(T,)`` array; with ``over_depths`` the mean over the depths.
    """
    values: dict[str, dict[tuple, dict[int, list]]] = {}
    for r in records:
        if r.get("kind") == "eval" and r["task"] == task and metric in r:
            point = (r["eval_length"], None if over_depths else r["depth"])
            values.setdefault(variant_label(r), {}).setdefault(point, {}).setdefault(r["seed"], []).append(r[metric])
    return {label: {point: {seed: np.mean(np.asarray(x, dtype=float), axis=0) for seed, x in seeds.items()}
                    for point, seeds in points.items()} for label, points in values.items()}


def summarize(records: Sequence[dict], task: str, metric: str, *, over_depths: bool = False) -> dict[str, dict]:
    """Mean, min, max and count over seeds of ``metric`` for every model variant and evaluation point.

    Args:
        records: the stored records (``"kind": "eval"`` ones are used).
        task: ``"lm"`` or ``"passkey"``.
        metric: a scalar field (``"loss"``, ``"exact_match"``, ...) or ``"loss_per_position"``
            (a list, reduced elementwise).
        over_depths: average each seed's values over the passkey depths first (the point's depth
            is then ``None``).

    Returns:
        ``{label: {(eval_length, depth): {"mean", "min", "max", "n"}}}`` (``depth`` is ``None`` for
        the LM), labels in the order they first appear (:func:`variant_label`); ``n`` counts seeds.
    """
    out: dict[str, dict] = {}
    for label, points in per_seed(records, task, metric, over_depths=over_depths).items():
        out[label] = {}
        for point, seeds in points.items():
            v = np.asarray(list(seeds.values()))  # (seeds, ...)
            out[label][point] = {"mean": v.mean(0), "min": v.min(0), "max": v.max(0), "n": len(v)}
    return out


def identity_at_training_length(summary: dict[str, dict], train_length: int) -> dict[str, dict]:
    """``summary`` with the points at ``L`` of each variant that is the identity there filled in.

    Log-n scaling and the zero-shot RoPE scalings (factor 1 at ``L``) are evaluated only past ``L``
    (at ``L`` they are the plain model); their curves start from the plain model's points at ``L``.
    """
    out = {label: dict(points) for label, points in summary.items()}
    for label, points in out.items():
        base = label.removesuffix(" + log-n").split(",")[0] if "fine-tuned" not in label else None
        if base is not None and base != label and base in summary:
            for (n, depth), s in summary[base].items():
                if n == train_length:
                    points.setdefault((n, depth), s)
        out[label] = dict(sorted(points.items(), key=lambda item: (item[0][0], item[0][1] or 0.0)))
    return out


def _is_rope_variant(label: str) -> bool:
    return label.startswith("rope") and label != "rope + log-n"


def _panels(labels: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The panels of a figure: plain methods, methods with log-n, RoPE's scalings and fine-tunes."""
    plain = [x for x in labels if "," not in x and "log-n" not in x]
    logn = [x for x in labels if x.endswith("+ log-n") and "," not in x]
    rope = ["rope"] * ("rope" in labels) + [x for x in labels if x.startswith("rope,")]
    panels = [("every method", plain), ("with log-n scaling past L", logn), ("RoPE: scalings and fine-tunes", rope)]
    return [(title, members) for title, members in panels if members]


def _figure(rows: int, cols: int, width: float = 5.0, height: float = 3.6, **kw):
    """A figure of ``rows x cols`` axes (a 2-D array), each cycling through 20 distinct colours.

    No backend is chosen here: in Jupyter the figure is drawn inline, in a script without a screen
    matplotlib falls back to Agg by itself.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained", **kw)
    colours = plt.get_cmap("tab20").colors
    for ax in axes.flat:  # 20 colours, one per method: the ten strong ones of tab20 first, then their light pairs
        ax.set_prop_cycle(color=colours[0::2] + colours[1::2])
    return fig, axes


def _save(fig, directory: str | Path, name: str) -> Path:
    import matplotlib.pyplot as plt

    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _summary(records: Sequence[dict], task: str, metric: str, over_depths: bool = False) -> tuple[dict, int]:
    """The :func:`summarize` of a study's records, with the identity variants filled in at ``L``, and ``L``."""
    summary = summarize(records, task, metric, over_depths=over_depths)
    if not summary:
        return {}, 0
    L = next(r["trained_length"] for r in records if "trained_length" in r)
    return identity_at_training_length(summary, L), L


def _check_labels(summary: dict, labels: Sequence[str], what: str) -> None:
    missing = [x for x in labels if x not in summary]
    if missing:
        raise ValueError(f"{what}: labels {missing} have no records; available: {list(summary)}")


def loss_vs_position_figure(records: Sequence[dict], length: Optional[int] = None, *,
                            panels: Optional[dict[str, Sequence[str]]] = None, smooth: Optional[int] = None,
                            live: Optional[Sequence[dict]] = None):
    """Byte-LM loss at every position of windows of ``length`` (default: the longest evaluated), a figure.

    Each curve is the mean over seeds with the range over seeds shaded, as a running mean over
    ``smooth`` positions (default ``L / 4``); the training length ``L`` is a dashed line. The
    records of a second run (``live``) are drawn dotted in the colour of the same label.

    Args:
        records: a study's records (its ``"records"``).
        length: the window length shown.
        panels: ``{title: [labels]}`` (:func:`variant_label` names), one panel each; default: plain
            methods, methods with log-n, RoPE's scalings and fine-tunes.
        smooth: the running-mean width in positions.
        live: records to overlay (their labels that are not in a panel are ignored).

    Returns:
        The matplotlib figure, or ``None`` if ``records`` has no LM evaluations.

    Raises:
        ValueError: for a label in ``panels`` with no records at ``length``.
    """
    summary, L = _summary(records, "lm", "loss_per_position")
    if not summary:
        return None
    length = length or max(n for points in summary.values() for n, _ in points)
    width = smooth or max(1, L // 4)
    at_length = {x: points for x, points in summary.items() if (length, None) in points}
    chosen = list(panels.items()) if panels else _panels(list(at_length))
    _check_labels(at_length, [x for _, labels in chosen for x in labels], f"windows of {length}")
    overlay = _summary(live, "lm", "loss_per_position")[0] if live else {}
    run = lambda v: np.convolve(v, np.ones(width) / width, mode="valid")  # noqa: E731
    fig, axes = _figure(1, len(chosen))
    for ax, (title, labels) in zip(axes[0], chosen):
        for label in labels:
            s = at_length[label][(length, None)]
            x = np.arange(len(run(s["mean"]))) + width - 1
            line, = ax.plot(x, run(s["mean"]), lw=1.2, label=f"{label} (mean of {s['n']})")
            if s["n"] > 1:
                ax.fill_between(x, run(s["min"]), run(s["max"]), color=line.get_color(), alpha=0.15, lw=0)
            if (length, None) in overlay.get(label, {}):
                extra = overlay[label][(length, None)]
                ax.plot(x, run(extra["mean"]), lw=0.7, ls=":", color=line.get_color(), label=f"{label} (live)")
        ax.axvline(L, color="k", ls="--", lw=0.8)
        ax.set(title=f"{title}: windows of {length}", xlabel="position (tokens)", ylabel="loss (nats/byte)")
        ax.legend(fontsize=6, ncol=2)
    return fig


def length_sweep_figure(records: Sequence[dict], *, panels: Optional[dict[str, Sequence[str]]] = None,
                        live: Optional[Sequence[dict]] = None):
    """Mean LM loss (top row) and passkey exact match averaged over depths (bottom row) against length, a figure.

    Error bars are the range over seeds; the x axis is in multiples of ``L`` (log scale). The
    records of a second run (``live``, e.g. one seed rerun in a notebook) are drawn as open
    diamonds in the colour of the same label.

    Args:
        records: a study's records.
        panels: ``{title: [labels]}``, one column each; default: plain methods, methods with log-n,
            RoPE's scalings and fine-tunes.
        live: records to overlay (their labels that are not in a panel are ignored).

    Returns:
        The matplotlib figure, or ``None`` if ``records`` has no evaluations.

    Raises:
        ValueError: for a label in ``panels`` that no task of ``records`` has.
    """
    tasks = [("lm", "loss", False, "loss (nats/byte)"),
             ("passkey", "exact_match", True, "passkey exact match (mean over depths)")]
    rows = [(*_summary(records, task, metric, over_depths), ylabel, task, metric, over_depths)
            for task, metric, over_depths, ylabel in tasks]
    rows = [row for row in rows if row[0]]
    if not rows:
        return None
    every = {label: None for summary, *_ in rows for label in summary}
    chosen = list(panels.items()) if panels else _panels(list(every))
    _check_labels(every, [x for _, labels in chosen for x in labels], "length sweep")
    fig, axes = _figure(len(rows), len(chosen), sharex=True)
    for i, ((summary, L, ylabel, task, metric, over_depths), ax_row) in enumerate(zip(rows, axes)):
        overlay = _summary(live, task, metric, over_depths)[0] if live else {}
        for ax, (title, labels) in zip(ax_row, chosen):
            for label in (x for x in labels if x in summary):
                points = sorted(summary[label].items())
                n = np.array([length for (length, _), _ in points]) / L
                mean, lo, hi = (np.array([float(s[k]) for _, s in points]) for k in ("mean", "min", "max"))
                bars = ax.errorbar(n, mean, yerr=[mean - lo, hi - mean], marker="o", ms=3, lw=1, capsize=2,
                                   label=label)
                if label in overlay:
                    extra = sorted(overlay[label].items())
                    ax.scatter([length / L for (length, _), _ in extra], [float(s["mean"]) for _, s in extra],
                               marker="D", s=28, facecolors="none", edgecolors=bars[0].get_color(), zorder=3)
            ax.set_xscale("log", base=2)
            multiples = sorted({length / L for label in labels if label in summary for length, _ in summary[label]})
            ax.set_xticks(multiples, [f"{m:g}" for m in multiples])
            ax.set(title=title if i == 0 else None, ylabel=ylabel)
            ax.legend(fontsize=6, ncol=2)
        for ax in ax_row:
            ax.set_xlabel(f"evaluation length (multiples of L = {L})" if i == len(rows) - 1 else "")
    return fig


def passkey_grid_figure(records: Sequence[dict], labels: Optional[Sequence[str]] = None, *, cols: int = 6):
    """Passkey exact match (mean over seeds) at every (evaluation length, depth), one panel per model variant.

    Each cell is annotated with its value.

    Args:
        records: a study's records.
        labels: the variants shown, in order (default: every one).
        cols: panels per row.

    Returns:
        The matplotlib figure, or ``None`` if ``records`` has no passkey evaluations.

    Raises:
        ValueError: for a label with no passkey records.
    """
    summary, L = _summary(records, "passkey", "exact_match")
    if not summary:
        return None
    labels = list(labels) if labels is not None else list(summary)
    _check_labels(summary, labels, "passkey grid")
    cols = min(cols, len(labels))
    rows = -(-len(labels) // cols)
    fig, axes = _figure(rows, cols, width=2.1, height=2.2, sharex=True, sharey=True)
    image = None
    for ax, label in zip(axes.flat, labels):
        lengths = sorted({n for n, _ in summary[label]})
        depths = sorted({d for _, d in summary[label]})
        grid = np.full((len(depths), len(lengths)), np.nan)
        for (n, d), s in summary[label].items():
            grid[depths.index(d), lengths.index(n)] = float(s["mean"])
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
        for (r, c), value in np.ndenumerate(grid):
            ax.text(c, r, "1" if value >= 1 else f"{value:.2f}"[1:], ha="center", va="center", fontsize=6,
                    color="w" if value < 0.6 else "k")
        ax.set_xticks(range(len(lengths)), [f"{n // L}L" if n % L == 0 else str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_title(label.replace(" zero-shot", "\nzero-shot").replace(" fine-tuned", "\nfine-tuned"), fontsize=7)
        ax.grid(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("depth", fontsize=7)
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    n_seeds = max(int(s["n"]) for points in summary.values() for s in points.values())
    fig.colorbar(image, ax=axes, shrink=0.8, label=f"exact match (mean of {n_seeds} seeds)")
    return fig


def plot_loss_vs_position(data: dict, directory: str | Path, length: Optional[int] = None,
                          name: str = "extrapolation_loss_vs_position.png") -> Optional[Path]:
    """:func:`loss_vs_position_figure` of a stored study, saved as ``directory/name`` (``None``: no LM records)."""
    fig = loss_vs_position_figure(data["records"], length)
    return None if fig is None else _save(fig, directory, name)


def plot_length_sweep(data: dict, directory: str | Path,
                      name: str = "extrapolation_length_sweep.png") -> Optional[Path]:
    """:func:`length_sweep_figure` of a stored study, saved as ``directory/name`` (``None``: no evaluations)."""
    fig = length_sweep_figure(data["records"])
    return None if fig is None else _save(fig, directory, name)


def plot_passkey_grid(data: dict, directory: str | Path,
                      name: str = "extrapolation_passkey_grid.png") -> Optional[Path]:
    """:func:`passkey_grid_figure` of a stored study, saved as ``directory/name`` (``None``: no passkey records)."""
    fig = passkey_grid_figure(data["records"])
    return None if fig is None else _save(fig, directory, name)


def plot_all(data: dict, directory: str | Path) -> list[Path]:
    """Write the three figures of a stored study to ``directory``; returns the paths written."""
    paths = [plot_loss_vs_position(data, directory), plot_length_sweep(data, directory),
             plot_passkey_grid(data, directory)]
    return [p for p in paths if p is not None]
