"""Multi-seed comparisons of position methods, stored as JSON.

A :class:`Study` is a list of :class:`Arm` s (a position method and how to build it), the seeds,
and the settings every arm is trained in:

- ``"lm"``: next-byte prediction on the standard-library corpus (:func:`posenc.lab.train.train`),
  scored by the validation loss in nats per byte at the training length;
- ``"copy"``: the copy task of :func:`posenc.lab.data.copy_task` (``"qzbk|qzbk"``), trained on the
  answer tokens only (:func:`posenc.lab.train.train_task`) and scored by the accuracy on the copied
  half. Copying a string of ``n`` letters means reading, from the position that predicts a letter,
  the letter exactly ``n`` positions back (``n + 1`` before the predicted one), which a model cannot
  do without some notion of position;
- ``"copy-long"``: the same task trained for longer (:attr:`Study.copy_long`), in studies that
  define it, to see whether what does not copy at the standard budget learns to later.

Each (arm, seed, setting) is one *cell*; a cell's seed sets both the initialisation and the data
order. Command line (the file records the command that rebuilds it, and each record the command,
commit, versions, machine and wall time of its own run)::

    python -m posenc.lab.experiments.compare methods                 # -> book/results/methods.json
    python -m posenc.lab.experiments.compare methods --arms rope alibi --seeds 0 1 2 3 4
    python -m posenc.lab.experiments.compare methods --shard 0/2 &   # two processes, then
    python -m posenc.lab.experiments.compare methods --shard 1/2     # both write the same file

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

from posenc.lab.data import copy_task, load_stdlib_corpus
from posenc.lab.experiments.records import RESULTS_DIR, append_records, finished_keys, load_records, provenance, stamp
from posenc.lab.lm import LMConfig, TinyLM
from posenc.method import PositionMethod
from posenc.lab.train import TrainConfig, curve_steps, evaluate, task_accuracy, train, train_task

#: The settings an arm can be trained in (``"copy-long"`` only in studies with :attr:`Study.copy_long`).
SETTINGS = ("lm", "copy", "copy-long")


#: What the protocol tunes per method (the book's "How the experiments work"), either the step size of the
#: position method's parameters (a multiplier of their learning rate) or, for a method with no
#: parameters, the scale of its fixed code (a multiplier of its ``scale``).
KNOBS = ("position_lr", "code_scale")

#: The multipliers every tuned method is tried at (the same small search for every method); one step
#: below the default and three above, since a shared learning rate limits how far a position
#: parameter can travel (see the protocol chapter).
GRID = (0.3, 1.0, 3.0, 10.0, 30.0)


@dataclass(frozen=True)
class Arm:
    """One compared configuration: a label and the position method it builds."""

    label: str  #: name in tables and plots
    method: str  #: a registered method name (:func:`posenc.method.build_method`), or a label of a custom builder
    build: Optional[Callable[[LMConfig], PositionMethod]] = None  #: custom builder; ``None`` uses ``method``
    #: builds the regulariser from the freshly built model; returns the ``penalty`` of :func:`~posenc.lab.train.train`
    penalty: Optional[Callable[[TinyLM], Callable[[], torch.Tensor]]] = None
    #: what a protocol study tunes for this arm, a name of :data:`KNOBS`, ``None`` for nothing, or
    #: ``"auto"``: ``"position_lr"`` if the method has parameters, else ``"code_scale"`` if it has a
    #: ``scale``, else nothing (NoPE, RoPE, ALiBi)
    knob: Optional[str] = "auto"
    grid: Optional[tuple[float, ...]] = None  #: this arm's multipliers (``None``: the study's :attr:`Study.grid`)
    #: whether a choice at an end of the grid is followed by one more multiplier beyond it
    #: (:func:`grid_extension`); off where the knob cannot go further (a scale capped by the method)
    extend: bool = True

    def make(self, config: LMConfig) -> PositionMethod | str:
        """The method to pass to :class:`~posenc.lab.lm.TinyLM` for ``config``."""
        return self.method if self.build is None else self.build(config)


def knob_of(arm: Arm, method: PositionMethod) -> Optional[str]:
    """The knob the protocol tunes for ``arm``, whose built method is ``method`` (see :attr:`Arm.knob`)."""
    if arm.knob != "auto":
        return arm.knob
    if any(p.requires_grad for p in method.parameters()):
        return "position_lr"
    return "code_scale" if isinstance(getattr(method, "scale", None), float) else None


@dataclass
class TrainedRun:
    """What a study's ``measure`` function is given besides the trained model."""

    study: "Study"  #: the study being run
    arm: Arm  #: the arm that was trained
    seed: int  #: the cell's seed
    setting: str  #: ``"lm"``, ``"copy"`` or ``"copy-long"``
    initial_position: dict[str, torch.Tensor]  #: ``model.position.state_dict()`` before training (copies)
    history: object  #: the :class:`~posenc.lab.train.TrainResult` of the run
    corpus: object  #: the :class:`~posenc.lab.data.Corpus` the LM was trained on (``None`` for ``"copy"``)
    #: the multiplier of the position parameters' learning rate (``TrainConfig.position_lr_mult``); AdamW's
    #: decoupled weight decay of those parameters is scaled by it too
    position_lr_mult: float = 1.0


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
    #: labels of the arms trained in ``"copy-long"`` (``None`` for every arm)
    copy_long_arms: Optional[tuple[str, ...]] = None
    eval_windows: int = 256  #: validation windows of the LM score
    other_lengths: tuple[int, ...] = ()  #: more window lengths at which the LM is evaluated (``val_loss_at``)
    eval_examples: int = 512  #: fresh examples of the copy score
    #: extra measurements of each trained model (both settings), ``measure(model, run) -> dict`` merged into its record
    measure: Optional[Callable[[TinyLM, TrainedRun], dict]] = None
    #: whether this is a study of the experiments protocol (stored under book/results/protocol/), which
    #: tunes each arm's knob over ``grid`` on ``tuning_seed``, runs every seed at the chosen multiplier
    #: and, where it is not 1, at 1 too (the untuned sensitivity), and records the learning curve and
    #: the per-item scores of the evaluation sample
    protocol: bool = False
    grid: tuple[float, ...] = GRID  #: multipliers tried (protocol studies)
    tuning_seed: int = 100  #: the seed the multiplier is chosen on; never one of the reported seeds
    curve_points: int = 8  #: measurements along each protocol run (at S/8, 2S/8, ..., S steps)
    curve_windows: int = 64  #: validation windows of an LM curve point
    curve_examples: int = 128  #: copy examples of a copy curve point
    tasks: tuple[str, ...] = ("lm", "copy")  #: the settings besides ``"copy-long"`` (a control may need one)

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings of this study (its :attr:`tasks`, and ``"copy-long"`` where :attr:`copy_long` is set)."""
        return self.tasks + (("copy-long",) if self.copy_long is not None else ())

    def cells(self, arms: Optional[Sequence[str]] = None, seeds: Optional[Sequence[int]] = None,
              settings: Optional[Sequence[str]] = None) -> list[tuple[str, int, str]]:
        """The ``(arm label, seed, setting)`` cells of the study, or of the chosen arms, seeds and settings."""
        labels = [a.label for a in self.arms] if arms is None else list(arms)
        return [(label, seed, setting) for setting in (self.settings if settings is None else settings)
                for seed in (self.seeds if seeds is None else seeds) for label in labels
                if setting != "copy-long" or self.copy_long_arms is None or label in self.copy_long_arms]

    def out_path(self) -> Path:
        """Where the study is stored: ``book/results/NAME.json``, protocol studies in ``book/results/protocol/``."""
        return RESULTS_DIR / ("protocol" if self.protocol else "") / f"{self.name}.json"

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


def _lambda_rule(penalty_name: str, nats: float = 0.1) -> Callable[[TinyLM], Callable[[], torch.Tensor]]:
    """Chapter 3's rule: the penalty's weight makes it ``nats`` (0.1) nats on the model's initial table."""
    from posenc import absolute

    R = getattr(absolute, penalty_name)

    def factory(model: TinyLM) -> Callable[[], torch.Tensor]:
        lam = nats / R(model.position.table().detach()).item()
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
    from posenc.lab.experiments.tables import measure_table_run

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


def _protocol(study: Study, **changes) -> Study:
    """``study`` under the experiments protocol: its arms and model, the protocol's budgets (chosen
    from the budget study, book/results/budget.json), a copy task clear of every method's built-in
    limit, curves, per-item scores and the tuning search."""
    base = dict(protocol=True, seeds=(0, 1, 2), copy_length=12, copy_long=None, copy_long_arms=None,
                lm=dataclasses.replace(study.lm, steps=PROTOCOL_LM_STEPS),
                copy=dataclasses.replace(study.copy, steps=PROTOCOL_COPY_STEPS))
    return dataclasses.replace(study, **(base | changes))


#: The protocol's budgets, in LM steps (batches of 16 windows of 128 bytes), where the budget study's
#: ranking has settled (its curves still fall: results are stated as after these steps), and
#: copy-task steps (batches of 32), twice the longest earlier copy runs, reported with their curves.
PROTOCOL_LM_STEPS = 4000
PROTOCOL_COPY_STEPS = 3000

#: The stored studies rerun under the experiments protocol (``--protocol``; book/results/protocol/).
#: The copy task copies 12 letters (the letter to copy is 12 positions back, the matching earlier
#: letter 13): inside every method's exact range (Shaw's clip at 16; in the copy model T5's and
#: DeBERTa's buckets are exact to 15 and 16), where the legacy studies' 16 sat on Shaw's clip.
PROTOCOL_STUDIES: dict[str, Study] = {name: _protocol(study) for name, study in STUDIES.items()}


def _arms_with(study: Study, **by_label: dict) -> tuple[Arm, ...]:
    """``study``'s arms, with the fields in ``by_label[label]`` replaced for the arms named there."""
    return tuple(dataclasses.replace(a, **by_label.get(a.label, {})) for a in study.arms)


PROTOCOL_STUDIES["methods"] = dataclasses.replace(PROTOCOL_STUDIES["methods"], arms=_arms_with(
    PROTOCOL_STUDIES["methods"],
    # its scale is a modulation depth in (0, 1] (0.5 registered): the grid spans 0.125 .. 1, and
    # cannot go further up
    multiplicative={"grid": (0.25, 0.5, 1.0, 2.0), "extend": False}))
PROTOCOL_STUDIES["naive"] = dataclasses.replace(PROTOCOL_STUDIES["naive"], arms=_arms_with(
    PROTOCOL_STUDIES["naive"],
    # chapter 1's raw codes are the point of comparison as they are; the matched ones are tuned
    **{label: {"knob": None} for label in ("integer, raw", "normalised, raw", "binary, raw")}))

#: Controls of the protocol studies, run only under ``--protocol`` (book/results/protocol/NAME.json).
#: ``copy16``: the copy task at the legacy length, 16 letters (the letter to copy 16 positions back),
#: at the protocol's budget, with five seeds, for the arms whose legacy copy results the protocol's
#: 12-letter task did not reproduce: it tells the length of the task from its budget. NoPE and
#: ALiBi (chapter 7: ALiBi below NoPE after 1,500 steps), and the sinusoidal code at its legacy
#: scale, untuned (chapter 2: far from copying after 1,500 steps).
PROTOCOL_CONTROLS: dict[str, Study] = {
    "copy16": dataclasses.replace(
        PROTOCOL_STUDIES["methods"], name="copy16", copy_length=16, seeds=(0, 1, 2, 3, 4), tasks=("copy",),
        arms=tuple(a for a in PROTOCOL_STUDIES["methods"].arms if a.label in ("nope", "alibi", "alibi, bias inside the scaling"))
        + (Arm("sinusoidal, scale x1", "sinusoidal", knob=None),)),
}


def run_cell(study: Study, arm: Arm | str, seed: int, setting: str, *, device: str | torch.device = "cpu",
             steps: Optional[int] = None, return_model: bool = False, mult: float = 1.0,
             stop_after: Optional[int] = None):
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
        mult: the multiplier of the arm's knob (:func:`knob_of`): of the position parameters'
            learning rate, or of the fixed code's scale; must be 1 for an arm with no knob.
        stop_after: train only the first ``stop_after`` steps of the study's schedule and return
            the record so far (the curve's points up to there; the final scores are those of the
            model at that step): a live check of a stored curve point in a fraction of the time.

    In a protocol study (:attr:`Study.protocol`) the record also holds ``knob`` and ``mult``, the
    learning ``curve`` (validation loss, or copy accuracy and answer loss, at
    :attr:`Study.curve_points` points), and the per-item scores behind a bootstrap of the
    evaluation sample: ``loss_per_window`` (LM) or ``row_exact`` (copy: a string of 0/1, one per example).

    Raises:
        ValueError: if ``setting`` is not one of the study's :attr:`~Study.settings`, or ``mult`` is
            not a positive number (or not 1 for an arm with no knob).
    """
    if setting not in study.settings:
        raise ValueError(f"setting must be one of {study.settings} for study {study.name!r}, got {setting!r}")
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not mult > 0:
        raise ValueError(f"mult must be a number > 0, got {mult!r}")
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
    knob = knob_of(arm, model.position)
    if knob is None and mult != 1:
        raise ValueError(f"arm {arm.label!r} has no knob to tune, so mult must be 1, got {mult!r}")
    if knob == "position_lr":
        cfg = dataclasses.replace(cfg, position_lr_mult=float(mult))
    elif knob == "code_scale" and mult != 1:
        model.position.scale = model.position.scale * float(mult)
    initial_position = {k: v.detach().clone() for k, v in model.position.state_dict().items()}
    penalty = None if arm.penalty is None else arm.penalty(model)
    record: dict = {"arm": arm.label, "method": arm.method, "seed": seed, "setting": setting, "steps": cfg.steps,
                    "position_parameters": sum(p.numel() for p in model.position.parameters())}
    if study.protocol:
        record.update(knob=knob, mult=float(mult))
    if stop_after is not None:
        record["stopped_after"] = stop_after
    curve_at = curve_steps(cfg.steps, study.curve_points) if study.protocol else ()
    start = time.perf_counter()
    if setting == "lm":
        corpus = load_stdlib_corpus()
        measure = (lambda m: {"val_loss": round(evaluate(m, corpus.val, cfg.seq_len, num_windows=study.curve_windows).loss, 5)}
                   ) if curve_at else None
        history = train(model, corpus.train, cfg, penalty=penalty, curve_at=curve_at, measure=measure, stop_after=stop_after)
        result = evaluate(model, corpus.val, study.lm.seq_len, num_windows=study.eval_windows)
        record["val_loss"] = result.loss
        if study.protocol:
            record["loss_per_window"] = [round(x, 5) for x in result.loss_per_window.tolist()]
            if seed == study.tuning_seed:  # the choice of multiplier is made on other windows than the report
                record["tune_val_loss"] = evaluate(model, corpus.val, study.lm.seq_len, num_windows=study.eval_windows,
                                                   between=True).loss
        record["loss_per_position"] = [round(x, 4) for x in result.loss_per_position.tolist()]
        if study.other_lengths:
            record["val_loss_at"] = {str(n): evaluate(model, corpus.val, n, num_windows=study.eval_windows).loss
                                     for n in study.other_lengths}
        record["corpus"] = corpus.fingerprint
        if study.measure is not None:
            record.update(study.measure(model, TrainedRun(study, arm, seed, setting, initial_position, history, corpus,
                                                                  cfg.position_lr_mult)))
    else:
        task = _copy_sampler(study.copy_length)

        def measure(m):
            a = task_accuracy(m, task, num_examples=study.curve_examples)
            return {"token_accuracy": a.token_accuracy, "exact_match": a.exact_match, "answer_loss": round(a.answer_loss, 5)}

        history = train_task(model, task, cfg, penalty=penalty, curve_at=curve_at, measure=measure if curve_at else None,
                             stop_after=stop_after)
        acc = task_accuracy(model, task, num_examples=study.eval_examples)
        record.update(token_accuracy=acc.token_accuracy, exact_match=acc.exact_match, answer_loss=acc.answer_loss)
        if study.protocol:
            record["row_exact"] = "".join(str(v) for v in acc.row_exact)
            if seed == study.tuning_seed:  # ... and on other examples
                record["tune_answer_loss"] = task_accuracy(model, task, num_examples=study.eval_examples,
                                                           seed=TUNE_EXAMPLES_SEED).answer_loss
        if study.measure is not None:
            record.update(study.measure(model, TrainedRun(study, arm, seed, setting, initial_position, history, None,
                                                                  cfg.position_lr_mult)))
    record["train_loss_every_10"] = [round(x, 4) for x in history.smoothed(10)[9::10]]
    if study.protocol:
        record["curve"] = history.curve
        record["train_seconds"] = round(history.seconds, 1)
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


#: The score a protocol study chooses an arm's multiplier by, per setting (lower is better), measured
#: on held-out items that the reported scores never use: the loss on the validation windows halfway
#: between the reported ones (``tune_val_loss``), or the answer loss on copy examples from another
#: seed (``tune_answer_loss``; a proper score, still informative once every letter is copied).
CRITERIA = {"lm": "tune_val_loss", "copy": "tune_answer_loss", "copy-long": "tune_answer_loss"}

#: The seed of the copy examples a tuning run is scored on (the reported examples come from 12345).
TUNE_EXAMPLES_SEED = 54321


def arm_knob(study: Study, arm: Arm | str) -> Optional[str]:
    """The knob ``study`` tunes for ``arm`` (:func:`knob_of` on the method built for the study's model)."""
    arm = study.arm(arm) if isinstance(arm, str) else arm
    if arm.knob != "auto":
        return arm.knob
    with torch.random.fork_rng(devices=[]):
        method = arm.make(study.model)
        method = TinyLM(study.model, method).position  # a registered name is built by the model
    return knob_of(arm, method)


def arm_grid(study: Study, arm: Arm | str) -> tuple[float, ...]:
    """The multipliers tried for ``arm``: ``(1.0,)`` without a knob, else the arm's or the study's grid."""
    arm = study.arm(arm) if isinstance(arm, str) else arm
    return (1.0,) if arm_knob(study, arm) is None else tuple(float(m) for m in (arm.grid or study.grid))


#: Scores of the tuning criterion that differ by less than this (nats) are ties, broken toward
#: multiplier 1: a copy task learnt perfectly at several multipliers has answer losses of 1e-5
#: and less, whose order means nothing.
TIE = 1e-3


def _best(tried: dict, mults, metric: str) -> float:
    low = min(tried[m][metric] for m in mults)
    return min((m for m in mults if tried[m][metric] < low + TIE), key=lambda m: abs(math.log(m)))


def grid_extension(grid: Sequence[float], best: float) -> Optional[float]:
    """The multiplier one step of the grid's spacing beyond its end, when ``best`` is at that end
    (``grid[0]**2 / grid[1]`` below, ``grid[-1]**2 / grid[-2]`` above); ``None`` when ``best`` is inside."""
    grid = sorted(grid)
    if len(grid) < 2 or grid[0] < best < grid[-1]:
        return None
    return grid[0] ** 2 / grid[1] if best == grid[0] else grid[-1] ** 2 / grid[-2]


def chosen_mult(records: Sequence[dict], study: Study, arm: str, setting: str) -> Optional[float]:
    """The multiplier a protocol study chose for ``arm`` in ``setting``.

    The best :data:`CRITERIA` score (held-out windows or examples) on the tuning seed over the
    arm's grid; scores within :data:`TIE` of each other tie, and ties go to the multiplier nearest 1.
    A choice at an end of the grid is tried one step further (:func:`grid_extension`, unless the arm
    says not to) and the best of all is kept; a choice there again is kept as it is (the text flags it).

    Returns:
        ``1.0`` for an arm with no knob; ``None`` while a tuning run it needs is not stored.
    """
    grid = arm_grid(study, arm)
    if grid == (1.0,):
        return 1.0
    state = _tuning_state(records, study, arm, setting)
    if state is None:
        return None
    tried, best, extra = state
    if extra is None:
        return best
    return _best(tried, (*grid, extra), CRITERIA[setting]) if extra in tried else None


def pending_extension(records: Sequence[dict], study: Study, arm: str, setting: str) -> Optional[float]:
    """The extension multiplier :func:`chosen_mult` waits for (its tuning run is not stored), else ``None``."""
    state = _tuning_state(records, study, arm, setting) if arm_grid(study, arm) != (1.0,) else None
    if state is None:
        return None
    tried, _, extra = state
    return extra if extra is not None and extra not in tried else None


def _tuning_state(records: Sequence[dict], study: Study, arm: str, setting: str) -> Optional[tuple]:
    """``(tried, best on the grid, extension or None)`` for ``arm`` in ``setting``; ``None`` while a
    run of the grid is missing. ``tried`` maps each stored multiplier to its tuning record."""
    grid = arm_grid(study, arm)
    tried = {r["mult"]: r for r in records if r["arm"] == arm and r["setting"] == setting
             and r["seed"] == study.tuning_seed and "mult" in r}
    if any(m not in tried for m in grid):
        return None
    best = _best(tried, grid, CRITERIA[setting])
    return tried, best, grid_extension(grid, best) if study.arm(arm).extend else None


def select(records: Sequence[dict], study: Study, role: str = "tuned") -> list[dict]:
    """The records of a protocol study in one role: ``"tuned"`` (the reported seeds at each arm's
    chosen multiplier), ``"untuned"`` (the reported seeds at multiplier 1, the sensitivity) or
    ``"tuning"`` (the tuning seed at every multiplier).

    Raises:
        ValueError: for another role.
    """
    if role not in ("tuned", "untuned", "tuning"):
        raise ValueError(f"role must be 'tuned', 'untuned' or 'tuning', got {role!r}")
    if role == "tuning":
        return [r for r in records if r["seed"] == study.tuning_seed]
    chosen = {(r["arm"], r["setting"]): 1.0 for r in records}
    if role == "tuned":
        chosen = {key: chosen_mult(records, study, *key) for key in chosen}
    return [r for r in records if r["seed"] != study.tuning_seed and r.get("mult", 1.0) == chosen[r["arm"], r["setting"]]]


def run_study(study: Study, out: str | Path, *, arms: Optional[Sequence[str]] = None,
              seeds: Optional[Sequence[int]] = None, settings: Optional[Sequence[str]] = None,
              shard: tuple[int, int] = (0, 1), device: str = "cpu", command: str = "", log=print,
              poll_seconds: float = 30.0) -> dict:
    """Run every missing cell of ``study`` (or of the chosen arms, seeds and settings) into ``out``.

    Cells are dealt round-robin to ``shard = (index, count)`` so that several processes can share
    the grid; each finished cell is appended to ``out`` at once (under a lock), so an interrupted
    run loses at most the cell in progress. ``settings`` defaults to all of the study's; ``command``
    (the invocation) is stored in each record, while the file's ``meta.command`` is the command that
    rebuilds the whole study.

    A protocol study (:attr:`Study.protocol`) runs in two phases: first the tuning seed at every
    multiplier of each arm's grid (:func:`arm_grid`), and one step beyond a grid's end where the
    best is there (:func:`pending_extension`); once all of those are stored (a shard that finishes
    its share waits, polling every ``poll_seconds``), every reported seed at the chosen multiplier
    (:func:`chosen_mult`) and, where that is not 1, at 1 as well.

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
    origin = provenance(device)  # read once, before training: the code this process imported

    def run(cells: list[tuple[str, int, str, float]], phase: str, dealt: bool = False) -> None:
        mine = cells if dealt else cells[shard[0]::shard[1]]
        for i, (label, seed, setting, mult) in enumerate(mine):
            if (label, seed, setting, mult) in finished_keys(out, _cell_key):
                continue
            record = run_cell(study, label, seed, setting, device=device, mult=mult)
            append_records(out, [stamp(record, origin, command)], _cell_key, lambda records: _meta(study, records))
            score = record.get("val_loss", record.get("token_accuracy"))
            log(f"[{phase} {i + 1}/{len(mine)}] {setting:4s} {label:32s} seed {seed} x{mult:g}: {score:.4f} "
                f"({record['seconds']:.0f} s)")

    if not study.protocol:
        run([(label, seed, setting, 1.0) for label, seed, setting in study.cells(labels, seeds, settings)], "cell")
        return load_records(out)
    grids = {label: arm_grid(study, label) for label in labels}
    tuning = [(label, study.tuning_seed, setting, m) for setting in settings for label in labels
              if grids[label] != (1.0,) for m in grids[label]]
    run(tuning, "tune")
    # an extension of the grid is run by the shard that owns its (arm, setting) pair, whichever
    # shard's runs completed that grid, so that no extension is left to nobody
    pairs = [(label, setting) for setting in settings for label in labels if grids[label] != (1.0,)]
    owned = set(pairs[shard[0]::shard[1]])
    while True:  # every shard needs every arm's choice, extensions of the grid included
        records = load_records(out)["records"] if out.exists() else []
        extra = [(label, study.tuning_seed, setting, m) for label, setting in pairs if (label, setting) in owned
                 and (m := pending_extension(records, study, label, setting)) is not None]
        if extra:
            run(extra, "extend", dealt=True)
            continue
        chosen = {(label, setting): chosen_mult(records, study, label, setting) for label in labels for setting in settings}
        if all(v is not None for v in chosen.values()):
            break
        log(f"waiting for {sum(v is None for v in chosen.values())} arms' tuning runs from other shards")
        time.sleep(poll_seconds)
    main = [(label, seed, setting, m) for label, seed, setting in study.cells(labels, seeds, settings)
            for m in sorted({chosen[label, setting], 1.0})]
    run(main, "main")
    return load_records(out)


def _cell_key(record: dict) -> tuple[str, int, str, float]:
    return record["arm"], record["seed"], record["setting"], record.get("mult", 1.0)


def _meta(study: Study, records: list[dict]) -> dict:
    meta = {
        "study": study.name,
        "command": f"python -m posenc.lab.experiments.compare {study.name}" + (" --protocol" if study.protocol else ""),
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
    if study.protocol:
        arms = sorted({r["arm"] for r in records})
        meta["protocol"] = {
            "grid": list(study.grid), "tuning_seed": study.tuning_seed, "criteria": CRITERIA,
            "curve_points": study.curve_points, "curve_windows": study.curve_windows,
            "curve_examples": study.curve_examples, "evaluation": "the same validation windows and copy examples "
            "for every arm and seed (evenly spaced windows; examples drawn from seed 12345)",
            "tie": TIE, "extension": "a choice at an end of the grid is tried one grid step further",
            "chosen": {f"{a} / {s}": chosen_mult(records, study, a, s) for a in arms for s in study.settings
                       if any(r["arm"] == a and r["setting"] == s for r in records)},
        }
    return meta


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posenc.lab.experiments.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("study", choices=sorted(STUDIES) + sorted(PROTOCOL_CONTROLS))
    parser.add_argument("--protocol", action="store_true",
                        help="the study under the experiments protocol (PROTOCOL_STUDIES, or a control of them, "
                             "PROTOCOL_CONTROLS; book/results/protocol/)")
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
    if args.study in PROTOCOL_CONTROLS and not args.protocol:
        parser.error(f"{args.study} is a control of the protocol studies: run it with --protocol")
    torch.set_num_threads(args.threads)
    study = ((PROTOCOL_STUDIES | PROTOCOL_CONTROLS) if args.protocol else STUDIES)[args.study]
    out = args.out or study.out_path()
    command = shlex.join(["python", "-m", "posenc.lab.experiments.compare", *(argv if argv is not None else sys.argv[1:])])
    run_study(study, out, arms=args.arms, seeds=args.seeds, settings=args.settings, shard=(index, count),
              device=args.device, command=command)


if __name__ == "__main__":
    main()
