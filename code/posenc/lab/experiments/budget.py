"""How long is long enough: the tiny LM trained to several budgets, with its learning curves.

The experiments protocol states every comparison at a budget where the ranking of the compared
curves has settled, and says after how many steps (the book's "How the experiments work"). This study measures where that is for the
studies' model (width 64, 2 layers, 4 heads, windows of 128 bytes, batches of 16): each position
method is trained to each budget ``S`` in ``budgets`` (the warm-up, then a cosine decay stretched to
``S`` steps: a separate run per budget, since the schedule depends on ``S``), with its validation
loss measured along the way (:attr:`~posenc.lab.train.TrainResult.curve`) and, at the end, on the same
windows for every method and budget.

Records: one per ``(method, seed, steps)``: ``val_loss`` (nats/byte, ``eval_windows`` validation
windows of 128 bytes), ``loss_per_window`` (for the bootstrap of the evaluation sample), ``curve``
(``{"step", "val_loss"}`` on ``curve_windows`` windows), the training loss every 10 steps, the
seconds, and each record's provenance. Command line::

    python -m posenc.lab.experiments.budget                      # -> book/results/budget.json
    python -m posenc.lab.experiments.budget --methods rope --budgets 1000 2000 --shard 0/2 &

An interrupted run resumes; shards share the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from posenc.lab.data import load_stdlib_corpus
from posenc.lab.experiments.records import RESULTS_DIR, append_records, finished_keys, load_records, provenance, stamp
from posenc.lab.lm import LMConfig, TinyLM
from posenc.lab.train import TrainConfig, curve_steps, evaluate, train


@dataclasses.dataclass(frozen=True)
class BudgetStudy:
    """The grid and the scale of the budget study."""

    methods: tuple[str, ...] = ("nope", "sinusoidal", "learned", "t5", "rope", "alibi")  #: registered methods
    budgets: tuple[int, ...] = (500, 1000, 2000, 4000, 8000)  #: training steps S of each run
    seeds: tuple[int, ...] = (0,)  #: seeds of initialisation and data order
    model: LMConfig = dataclasses.field(default_factory=lambda: LMConfig(d_model=64, n_layer=2, n_head=4, max_len=128))
    lm: TrainConfig = dataclasses.field(
        default_factory=lambda: TrainConfig(steps=1000, batch_size=16, seq_len=128, progress=False))  # steps set per run
    curve_points: int = 8  #: measurements along each run (at S/8, 2S/8, ..., S)
    curve_windows: int = 64  #: validation windows of a curve point
    eval_windows: int = 256  #: validation windows of the final score


STUDY = BudgetStudy()


def run_cell(study: BudgetStudy, method: str, seed: int, steps: int, device: str = "cpu") -> dict:
    """Train ``method`` for ``steps`` steps with ``seed``; its record (see the module docstring)."""
    corpus = load_stdlib_corpus()
    model = TinyLM(dataclasses.replace(study.model, seed=seed), method).to(device)
    cfg = dataclasses.replace(study.lm, steps=steps, seed=seed, warmup_steps=min(study.lm.warmup_steps, steps))
    at = curve_steps(steps, study.curve_points)
    start = time.perf_counter()
    history = train(model, corpus.train, cfg, curve_at=at,
                    measure=lambda m: {"val_loss": round(evaluate(m, corpus.val, cfg.seq_len,
                                                                  num_windows=study.curve_windows).loss, 5)})
    result = evaluate(model, corpus.val, cfg.seq_len, num_windows=study.eval_windows)
    return {"method": method, "seed": seed, "steps": steps, "val_loss": result.loss,
            "loss_per_window": [round(x, 5) for x in result.loss_per_window.tolist()],
            "curve": history.curve, "train_loss_every_10": [round(x, 4) for x in history.smoothed(10)[9::10]],
            "train_seconds": round(history.seconds, 1), "steps_per_second": round(steps / history.seconds, 2),
            "seconds": round(time.perf_counter() - start, 1), "corpus": corpus.fingerprint,
            "lm": dataclasses.asdict(cfg)}


def _key(record: dict) -> tuple[str, int, int]:
    return record["method"], record["seed"], record["steps"]


def _meta(study: BudgetStudy, records: list[dict]) -> dict:
    return {"study": "budget", "command": "python -m posenc.lab.experiments.budget",
            "model": dataclasses.asdict(study.model), "curve_points": study.curve_points,
            "curve_windows": study.curve_windows, "eval_windows": study.eval_windows,
            "seeds": sorted({r["seed"] for r in records}), "budgets": sorted({r["steps"] for r in records}),
            "wall_seconds": round(sum(r["seconds"] for r in records), 1)}


def run_study(study: BudgetStudy, out: str | Path, *, shard: tuple[int, int] = (0, 1), device: str = "cpu",
              command: str = "", log=print) -> dict:
    """Run every missing ``(method, seed, steps)`` of ``study`` (this shard's, costliest first) into ``out``."""
    grid = sorted(((m, s, b) for m in study.methods for s in study.seeds for b in study.budgets),
                  key=lambda cell: (-cell[2], cell[0], cell[1]))
    mine = grid[shard[0]::shard[1]]
    origin = provenance(device)
    for i, cell in enumerate(mine):
        if cell in finished_keys(out, _key):
            continue
        record = run_cell(study, *cell, device=device)
        append_records(out, [stamp(record, origin, command)], _key, lambda rs: _meta(study, rs), one_per_line=True)
        log(f"[{i + 1}/{len(mine)}] {cell[0]:12s} seed {cell[1]} {cell[2]:5d} steps: {record['val_loss']:.4f} "
            f"({record['seconds']:.0f} s, {record['steps_per_second']:.1f} steps/s)")
    return load_records(out)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posenc.lab.experiments.budget", description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(STUDY.methods))
    parser.add_argument("--budgets", nargs="+", type=int, default=list(STUDY.budgets))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(STUDY.seeds))
    parser.add_argument("--out", default=str(RESULTS_DIR / "budget.json"))
    parser.add_argument("--shard", default="0/1", help="INDEX/COUNT: run every COUNT-th cell from INDEX")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    index, count = (int(x) for x in args.shard.split("/"))
    if not 0 <= index < count:
        parser.error(f"--shard must be INDEX/COUNT with 0 <= INDEX < COUNT, got {args.shard}")
    torch.set_num_threads(args.threads)
    study = dataclasses.replace(STUDY, methods=tuple(args.methods), budgets=tuple(args.budgets), seeds=tuple(args.seeds))
    command = shlex.join(["python", "-m", "posenc.lab.experiments.budget", *(argv if argv is not None else sys.argv[1:])])
    run_study(study, args.out, shard=(index, count), device=args.device, command=command)


if __name__ == "__main__":
    main()
