"""Multi-seed comparisons of position methods, stored as JSON.

A :class:`Study` is a list of :class:`Arm` s (a position method and how to build it), the seeds,
and the settings every arm is trained in:

- ``"lm"``: next-byte prediction on the standard-library corpus (:func:`posenc.train.train`),
  scored by the validation loss in nats per byte at the training length;
- ``"copy"``: the copy task of :func:`posenc.data.copy_task` (``"qzbk|qzbk"``), trained on the
  answer tokens only (:func:`posenc.train.train_task`) and scored by the accuracy on the copied
  half. Copying a string of ``n`` letters means reading, from the position that predicts a letter,
  the letter exactly ``n`` positions back (``n + 1`` before the predicted one), which a model cannot
  do without some notion of position;
- ``"copy-long"``: the same task trained for longer (:attr:`Study.copy_long`), in studies that
  define it, to see whether what does not copy at the standard budget learns to later.

Each (arm, seed, setting) is one *cell*; a cell's seed sets both the initialisation and the data
order. Command line (the file records the command that rebuilds it, and each record the command,
commit, versions, machine and wall time of its own run)::

    python -m posenc.experiments.compare methods                 # -> book/results/methods.json
    python -m posenc.experiments.compare methods --arms rope alibi --seeds 0 1 2 3 4
    python -m posenc.experiments.compare methods --shard 0/2 &   # two processes, then
    python -m posenc.experiments.compare methods --shard 1/2     # both write the same file

An interrupted run resumes: cells already in the file are not recomputed. Writes are atomic and
serialised with a lock file, so shards can share the output file.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from posenc.data import copy_task, load_stdlib_corpus
from posenc.experiments.records import RESULTS_DIR, append_records, finished_keys, load_records, provenance, stamp
from posenc.lm import LMConfig, TinyLM
from posenc.method import PositionMethod
from posenc.train import TrainConfig, evaluate, task_accuracy, train, train_task

#: The settings an arm can be trained in (``"copy-long"`` only in studies with :attr:`Study.copy_long`).
SETTINGS = ("lm", "copy", "copy-long")


@dataclass(frozen=True)
class Arm:
    """One compared configuration: a label and the position method it builds."""

    label: str  #: name in tables and plots
    method: str  #: a registered method name (:func:`posenc.method.build_method`), or a label of a custom builder
    build: Optional[Callable[[LMConfig], PositionMethod]] = None  #: custom builder; ``None`` uses ``method``
    #: builds the regulariser from the freshly built model; returns the ``penalty`` of :func:`~posenc.train.train`
    penalty: Optional[Callable[[TinyLM], Callable[[], torch.Tensor]]] = None

    def make(self, config: LMConfig) -> PositionMethod | str:
        """The method to pass to :class:`~posenc.lm.TinyLM` for ``config``."""
        return self.method if self.build is None else self.build(config)


@dataclass
class TrainedRun:
    """What a study's ``measure`` function is given besides the trained model."""

    study: "Study"  #: the study being run
    arm: Arm  #: the arm that was trained
    seed: int  #: the cell's seed
    setting: str  #: ``"lm"``, ``"copy"`` or ``"copy-long"``
    initial_position: dict[str, torch.Tensor]  #: ``model.position.state_dict()`` before training (copies)
    history: object  #: the :class:`~posenc.train.TrainResult` of the run
    corpus: object  #: the :class:`~posenc.data.Corpus` the LM was trained on (``None`` for ``"copy"``)


@dataclass(frozen=True)
class Study:
    """Arms, seeds and the scale of one stored comparison."""

    name: str  #: file stem in ``book/results/``
    arms: tuple[Arm, ...]  #: compared configurations
    seeds: tuple[int, ...] = (0, 1, 2)  #: seeds of initialisation and data order
    model: LMConfig = field(default_factory=lambda: LMConfig(d_model=64, n_layer=2, n_head=4, max_len=128))  #: model shape
    lm: TrainConfig = field(default_factory=lambda: TrainConfig(steps=250, batch_size=16, seq_len=128, progress=False))  #: LM training
    copy_length: int = 16  #: letters to copy (sequence length ``2 * copy_length``)
    copy: TrainConfig = field(default_factory=lambda: TrainConfig(steps=300, batch_size=32, warmup_steps=30, progress=False))  #: copy training
    copy_long: Optional[TrainConfig] = None  #: a longer copy training, the ``"copy-long"`` setting (``None``: no such setting)
    #: labels of the arms trained in ``"copy-long"`` (``None``: every arm)
    copy_long_arms: Optional[tuple[str, ...]] = None
    eval_windows: int = 256  #: validation windows of the LM score
    other_lengths: tuple[int, ...] = ()  #: more window lengths at which the LM is evaluated (``val_loss_at``)
    eval_examples: int = 512  #: fresh examples of the copy score
    #: extra measurements of each trained model (both settings), ``measure(model, run) -> dict`` merged into its record
    measure: Optional[Callable[[TinyLM, TrainedRun], dict]] = None

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings of this study (``"copy-long"`` only for :attr:`copy_long_arms`)."""
        return ("lm", "copy") + (("copy-long",) if self.copy_long is not None else ())

    def cells(self, arms: Optional[Sequence[str]] = None, seeds: Optional[Sequence[int]] = None,
              settings: Optional[Sequence[str]] = None) -> list[tuple[str, int, str]]:
        """The ``(arm label, seed, setting)`` cells of the study, or of the chosen arms, seeds and settings."""
        labels = [a.label for a in self.arms] if arms is None else list(arms)
        return [(label, seed, setting) for setting in (self.settings if settings is None else settings)
                for seed in (self.seeds if seeds is None else seeds) for label in labels
                if setting != "copy-long" or self.copy_long_arms is None or label in self.copy_long_arms]

    def arm(self, label: str) -> Arm:
        """The arm called ``label``.

        Raises:
            KeyError: if no arm has that label.
        """
        for arm in self.arms:
            if arm.label == label:
                return arm
        raise KeyError(f"study {self.name!r} has no arm {label!r}; arms: {[a.label for a in self.arms]}")


def _naive_arms() -> tuple[Arm, ...]:
    """Chapter 1's codes, raw and rescaled to the token embeddings' RMS entry (0.02) at the training length."""
    from posenc.naive import BinaryPE, IntegerPE, NormalizedPE, binary_code, integer_code, normalized_code

    def rms(table: torch.Tensor) -> float:
        return table.pow(2).mean().sqrt().item()

    def matched(code: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[LMConfig], float]:
        return lambda c: 0.02 / rms(code(torch.arange(c.max_len), c))

    integer_scale = matched(lambda p, c: integer_code(p, c.d_model))
    normalized_scale = matched(lambda p, c: normalized_code(p, c.d_model, c.max_len))
    binary_scale = matched(lambda p, c: binary_code(p, c.d_model, num_bits=16))
    return (
        Arm("NoPE", "nope"),
        Arm("integer, raw", "integer-raw", lambda c: IntegerPE(c.d_model, scale=1.0)),
        Arm("integer, matched", "integer-matched", lambda c: IntegerPE(c.d_model, scale=integer_scale(c))),
        Arm("normalised, raw", "normalized-raw", lambda c: NormalizedPE(c.d_model, scale=1.0)),
        Arm("normalised, matched", "normalized-matched", lambda c: NormalizedPE(c.d_model, scale=normalized_scale(c))),
        Arm("binary, raw", "binary-raw", lambda c: BinaryPE(c.d_model, num_bits=16, scale=1.0)),
        Arm("binary, matched", "binary-matched", lambda c: BinaryPE(c.d_model, num_bits=16, scale=binary_scale(c))),
    )


def _alibi_before_scale(config: LMConfig) -> PositionMethod:
    from posenc.alibi import ALiBi

    return ALiBi(config.n_head, placement="before_scale", head_dim=config.head_dim)


def _lambda_rule(penalty_name: str) -> Callable[[TinyLM], Callable[[], torch.Tensor]]:
    """Chapter 3's rule: the penalty's weight makes it 0.1 nats on the model's initial table."""
    from posenc import absolute

    R = getattr(absolute, penalty_name)

    def factory(model: TinyLM) -> Callable[[], torch.Tensor]:
        lam = 0.1 / R(model.position.table().detach()).item()
        return lambda: lam * R(model.position.table())

    return factory


def _table_arms() -> tuple[Arm, ...]:
    """Chapter 3's tables: plain, three penalties, hybrid, sinusoidal, trained at low rank, and started larger."""
    from posenc.absolute import LearnedPE, LowRankPE

    def low_rank(rank: int) -> Callable[[LMConfig], PositionMethod]:
        return lambda c: LowRankPE(c.max_len, c.d_model, rank=rank)

    return (
        Arm("learned", "learned"),
        Arm("L2", "learned", penalty=_lambda_rule("l2_penalty")),
        Arm("difference", "learned", penalty=_lambda_rule("difference_penalty")),
        Arm("spectral", "learned", penalty=_lambda_rule("spectral_penalty")),
        Arm("hybrid", "hybrid"),
        Arm("sinusoidal", "sinusoidal"),
        Arm("low rank 2", "lowrank-2", low_rank(2)),
        Arm("low rank 8", "lowrank-8", low_rank(8)),
        # the plain table started five times larger (std 0.1): does a larger table copy?
        Arm("learned, init x5", "learned", lambda c: LearnedPE(c.max_len, c.d_model, std=0.1)),
    )


def _measure_tables(model: TinyLM, run: "TrainedRun") -> dict:
    from posenc.experiments.tables import measure_table_run

    return measure_table_run(model, run)


#: The stored studies, by name.
STUDIES: dict[str, Study] = {
    # every registered method of chapters 2-7, in the tiny LM and on the copy task
    "methods": Study("methods", tuple(Arm(name, name) for name in (
        "nope", "sinusoidal", "learned", "recurrent", "multiplicative", "shaw", "transformer_xl", "t5",
        "deberta", "tupe", "rope", "alibi")) + (Arm("alibi, bias inside the scaling", "alibi-before-scale",
                                                    _alibi_before_scale),),
                     # five times the copy steps, for the arms that did not copy every letter in 300
                     copy_long=TrainConfig(steps=1500, batch_size=32, warmup_steps=30, progress=False),
                     copy_long_arms=("nope", "sinusoidal", "learned", "recurrent", "multiplicative", "shaw", "t5",
                                     "alibi", "alibi, bias inside the scaling")),
    # chapter 3's learned tables: a table of 256 rows trained on windows of 128, 400 steps
    "tables": Study("tables", _table_arms(),
                    model=LMConfig(d_model=64, n_layer=2, n_head=4, max_len=256),
                    lm=TrainConfig(steps=400, batch_size=16, seq_len=128, progress=False),
                    copy_long=TrainConfig(steps=1500, batch_size=32, warmup_steps=30, progress=False),
                    measure=_measure_tables),
    # chapter 1's naive codes
    "naive": Study("naive", _naive_arms(), lm=TrainConfig(steps=200, batch_size=16, seq_len=128, progress=False),
                   other_lengths=(64,)),
}


def run_cell(study: Study, arm: Arm | str, seed: int, setting: str, *, device: str | torch.device = "cpu",
             steps: Optional[int] = None, return_model: bool = False):
    """Train one arm with one seed in one setting and return its record.

    The record is what the study stores: ``arm``, ``seed``, ``setting``, the score (``val_loss``,
    ``loss_per_position`` and ``val_loss_at`` the study's ``other_lengths`` for ``"lm"``, plus what
    the study's ``measure`` returns; ``token_accuracy``, ``exact_match`` and ``answer_loss`` for
    ``"copy"`` and ``"copy-long"``), the training loss curve (every 10th step), the number of position parameters and
    the seconds (training and measurements). The arm's ``penalty``, if any, is used in both settings.

    Args:
        study: the study whose scale to use.
        arm: an :class:`Arm` of the study or its label.
        seed: seeds the initialisation and the data order.
        setting: ``"lm"``, ``"copy"`` or (where the study defines it) ``"copy-long"``.
        device: where to train.
        steps: override the number of training steps (a shorter live run).
        return_model: also return the trained model, as ``(record, model)``.

    Raises:
        ValueError: if ``setting`` is not one of the study's :attr:`~Study.settings`.
    """
    if setting not in study.settings:
        raise ValueError(f"setting must be one of {study.settings} for study {study.name!r}, got {setting!r}")
    arm = study.arm(arm) if isinstance(arm, str) else arm
    if setting == "lm":
        model_cfg, cfg = dataclasses.replace(study.model, seed=seed), study.lm
    else:
        model_cfg = dataclasses.replace(study.model, seed=seed, max_len=2 * study.copy_length)
        cfg = study.copy if setting == "copy" else study.copy_long
    if steps is not None:
        cfg = dataclasses.replace(cfg, steps=steps, warmup_steps=min(cfg.warmup_steps, steps))
    cfg = dataclasses.replace(cfg, seed=seed)
    with torch.random.fork_rng(devices=[]):     # a custom-built method is seeded like the model, not by the global RNG
        torch.manual_seed(seed)
        method = arm.make(model_cfg)
    model = TinyLM(model_cfg, method).to(device)
    initial_position = {k: v.detach().clone() for k, v in model.position.state_dict().items()}
    penalty = None if arm.penalty is None else arm.penalty(model)
    record: dict = {"arm": arm.label, "method": arm.method, "seed": seed, "setting": setting, "steps": cfg.steps,
                    "position_parameters": sum(p.numel() for p in model.position.parameters())}
    start = time.perf_counter()
    if setting == "lm":
        corpus = load_stdlib_corpus()
        history = train(model, corpus.train, cfg, penalty=penalty)
        result = evaluate(model, corpus.val, study.lm.seq_len, num_windows=study.eval_windows)
        record["val_loss"] = result.loss
        record["loss_per_position"] = [round(x, 4) for x in result.loss_per_position.tolist()]
        if study.other_lengths:
            record["val_loss_at"] = {str(n): evaluate(model, corpus.val, n, num_windows=study.eval_windows).loss
                                     for n in study.other_lengths}
        record["corpus"] = corpus.fingerprint
        if study.measure is not None:
            record.update(study.measure(model, TrainedRun(study, arm, seed, setting, initial_position, history, corpus)))
    else:
        task = _copy_sampler(study.copy_length)
        history = train_task(model, task, cfg, penalty=penalty)
        acc = task_accuracy(model, task, num_examples=study.eval_examples)
        record.update(token_accuracy=acc.token_accuracy, exact_match=acc.exact_match, answer_loss=acc.answer_loss)
        if study.measure is not None:
            record.update(study.measure(model, TrainedRun(study, arm, seed, setting, initial_position, history, None)))
    record["train_loss_every_10"] = [round(x, 4) for x in history.smoothed(10)[9::10]]
    record["seconds"] = round(time.perf_counter() - start, 1)
    return (record, model) if return_model else record


def _copy_sampler(length: int) -> Callable[[int, torch.Generator], object]:
    return lambda batch_size, generator: copy_task(batch_size, length, generator)


def summarize(records: Sequence[dict], metric: str, setting: str) -> dict[str, dict]:
    """Mean, standard deviation, min, max and count of ``metric`` per arm, over seeds.

    ``metric`` is a key of the records, or a dotted path into nested ones (``"control.unseen"``,
    ``"rank_truncation.2"``); records without it are skipped.

    Returns:
        ``{arm: {"mean", "std", "min", "max", "n", "values"}}`` in the order the arms first appear;
        ``values`` are in the order of the records (by seed in a stored study).
    """
    out: dict[str, list[float]] = {}
    for r in records:
        value = _lookup(r, metric)
        if r["setting"] == setting and value is not None:
            out.setdefault(r["arm"], []).append(float(value))
    return {arm: {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else math.nan,
                  "min": min(v), "max": max(v), "n": len(v), "values": v} for arm, v in out.items()}


def _lookup(record: dict, metric: str):
    value = record
    for key in metric.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def run_study(study: Study, out: str | Path, *, arms: Optional[Sequence[str]] = None,
              seeds: Optional[Sequence[int]] = None, settings: Optional[Sequence[str]] = None,
              shard: tuple[int, int] = (0, 1), device: str = "cpu", command: str = "", log=print) -> dict:
    """Run every missing cell of ``study`` (or of the chosen arms, seeds and settings) into ``out``.

    Cells are dealt round-robin to ``shard = (index, count)`` so that several processes can share
    the grid; each finished cell is appended to ``out`` at once (under a lock), so an interrupted
    run loses at most the cell in progress. ``settings`` defaults to all of the study's; ``command``
    (the invocation) is stored in each record, while the file's ``meta.command`` is the command that
    rebuilds the whole study.

    Returns:
        The stored study after this run.
    """
    out = Path(out)
    labels = [a.label for a in study.arms] if arms is None else list(arms)
    for label in labels:
        study.arm(label)  # raises for unknown labels
    settings = study.settings if settings is None else list(settings)
    for setting in settings:
        if setting not in study.settings:
            raise ValueError(f"settings must be among {study.settings} for study {study.name!r}, got {setting!r}")
    grid = study.cells(labels, seeds, settings)
    mine = grid[shard[0]::shard[1]]
    origin = provenance(device)  # read once, before training: the code this process imported
    for i, (label, seed, setting) in enumerate(mine):
        if (label, seed, setting) in finished_keys(out, _cell_key):
            continue
        record = run_cell(study, label, seed, setting, device=device)
        append_records(out, [stamp(record, origin, command)], _cell_key, lambda records: _meta(study, records))
        score = record.get("val_loss", record.get("token_accuracy"))
        log(f"[{i + 1}/{len(mine)}] {setting:4s} {label:32s} seed {seed}: {score:.4f} ({record['seconds']:.0f} s)")
    return load_records(out)


def _cell_key(record: dict) -> tuple[str, int, str]:
    return record["arm"], record["seed"], record["setting"]


def _meta(study: Study, records: list[dict]) -> dict:
    return {
        "study": study.name, "command": f"python -m posenc.experiments.compare {study.name}",
        "model": dataclasses.asdict(study.model), "lm": dataclasses.asdict(study.lm),
        "copy": dataclasses.asdict(study.copy), "copy_length": study.copy_length,
        **({"copy_long": dataclasses.asdict(study.copy_long)} if study.copy_long is not None else {}),
        "eval_windows": study.eval_windows, "eval_examples": study.eval_examples,
        "seeds": sorted({r["seed"] for r in records}),
        "wall_seconds": round(sum(r["seconds"] for r in records), 1),
        "note": "meta.command rebuilds the whole study (finished cells are kept); each record carries the "
                "command, commit, torch version, machine and wall time of its own run (records made before "
                "the command was stored per record have no 'command').",
    }


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posenc.experiments.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("--arms", nargs="+", help="arm labels (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the study's)")
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, help="settings (default: all of the study's)")
    parser.add_argument("--out", help="output JSON (default: book/results/STUDY.json)")
    parser.add_argument("--shard", default="0/1", help="INDEX/COUNT: run every COUNT-th cell from INDEX")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    args = parser.parse_args(argv)
    index, count = (int(x) for x in args.shard.split("/"))
    if not 0 <= index < count:
        parser.error(f"--shard must be INDEX/COUNT with 0 <= INDEX < COUNT, got {args.shard}")
    torch.set_num_threads(args.threads)
    study = STUDIES[args.study]
    out = args.out or RESULTS_DIR / f"{study.name}.json"
    command = shlex.join(["python", "-m", "posenc.experiments.compare", *(argv if argv is not None else sys.argv[1:])])
    run_study(study, out, arms=args.arms, seeds=args.seeds, settings=args.settings, shard=(index, count),
              device=args.device, command=command)


if __name__ == "__main__":
    main()
