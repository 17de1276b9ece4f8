"""Length extrapolation: every position method trained at a length L and evaluated at 1x, 2x, 4x, 8x L.

The study trains the tiny LM (:class:`~posenc.lab.lm.TinyLM`) at ``L = train_length`` with every
registered position method (:data:`posenc.method.METHODS`: NoPE, sinusoidal, learned, T5, Shaw,
Transformer-XL, DeBERTa, TUPE, ALiBi, RoPE, ...) on two tasks, and evaluates each model at the
lengths ``L * multiples``:

- ``"lm"``: next-byte prediction on the standard-library corpus; scored by the validation loss,
  mean and per position (:func:`posenc.lab.train.evaluate`);
- ``"passkey"``: the passkey task (:func:`posenc.lab.data.passkey_retrieval`) trained at length ``L``
  (random depths) and scored by the exact-match and token accuracy of the key at every evaluation
  length and at each depth of ``depths`` (the fraction of the filler before the needle).

Variants evaluated on the same trained weights (no training, so they cost only evaluations):

- ``logn``: log-n scaling of the attention (:func:`posenc.attention.logn_query_scale`, Su 2021 in
  Qwen's form: the query at position ``n`` times ``max(1, log(n + 1) / log L)``). It is the identity
  up to ``L``, so a model trained with it at length ``L`` *is* the model trained without it; it is
  switched on at evaluation (``LMConfig.logn_length = L``), past ``L`` only;
- for a RoPE model, each zero-shot scaling of :data:`~posenc.rope.frequencies.ROPE_SCALINGS` in ``scalings``
  (``linear`` = position interpolation, ``ntk_aware``, ``dynamic``, ``yarn``, ``llama3``; built by
  :func:`~posenc.lab.experiments.variants.scaling_config` with ``factor = eval_length / L`` and
  original length ``L``), past ``L``
  (at ``L`` each is the identity). The attention scale of the scaling multiplies cos and sin, as in
  Hugging Face (:class:`~posenc.rope.RotaryEmbedding`).

For a RoPE model, each scaling of ``finetune_scalings`` (PI and YaRN by default, and ``"default"``,
RoPE unscaled, as their control: the same extra training with no change of position) is also
fine-tuned for ``finetune_steps`` at ``finetune_length`` (default: the longest evaluation length,
factor ``finetune_length / L``; 1 for the control) and evaluated at every length with that factor.

Positions: a method whose coverage is finite (a learned table, RoPE's cos/sin cache) is built for
the longest evaluation length, so it can be evaluated there: rows of a table past ``L`` are never
trained (each training record says how many: ``untrained_table_rows``). Every other method is built
for ``L`` (T5's and DeBERTa's bucket distances are set by ``max_len``, as a pre-trained model's are by
its pre-training length).

Records: one per training run (``"kind": "train"``: steps, batch, length, ``train_loss_last``, the
loss curve, seconds, position parameters, ``untrained_table_rows``; ``cell_seconds`` on the first
of a cell) and one per evaluation (``"kind": "eval"``), that is per ``(method, logn, scaling,
finetune, seed, task, eval_length[, depth])`` (:func:`record_key`): ``loss`` and
``loss_per_position`` for the LM, ``exact_match``, ``token_accuracy`` and ``answer_loss`` for the
passkey. ``scaling`` is ``"none"`` or a scaling's name, ``factor`` its factor, ``finetune`` ``None``
or the scaling fine-tuned. Each record has the command, commit, dirty flag, torch version and
hardware of its run (:mod:`posenc.lab.experiments.records`). A *cell* is ``(method, seed, task)``: one
model trained, every evaluation of it and, for RoPE, its fine-tunes. Command line::

    python -m posenc.lab.experiments.extrapolation                       # -> book/results/extrapolation.json
    python -m posenc.lab.experiments.extrapolation --methods rope alibi --seeds 0 --plots /tmp/plots
    python -m posenc.lab.experiments.extrapolation --preset gpu --device cuda --out /tmp/extrapolation_gpu.json
    # two processes on one machine, each claiming the next cell when free (rank 0 writes the records):
    python -m torch.distributed.run --standalone --nproc_per_node 2 -m posenc.lab.experiments.extrapolation
    # one model trained by all processes (DistributedDataParallel, each its slice of every batch):
    python -m torch.distributed.run --standalone --nproc_per_node 2 -m posenc.lab.experiments.extrapolation --ddp
    # several tiny models at once on one GPU: process i on cuda:(i % GPUs), gloo between them
    python -m torch.distributed.run --standalone --nproc_per_node 8 -m posenc.lab.experiments.extrapolation \\
        --preset gpu --device cuda
    # several machines: the same command on each, with torchrun's multi-node arguments
    python -m torch.distributed.run --nnodes 2 --node_rank 0 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint HOST:29500 -m posenc.lab.experiments.extrapolation --preset gpu --device cuda

Under the experiments protocol (``protocol=True``, the ``"protocol"`` preset) every length is scored
on prefixes of the same validation windows (placed for the longest length, so that a change with
length is a change of the model, not of the text); each evaluation keeps its per-window losses (and
per window, the loss over each band ``[0, L), [L, 2L), [2L, 4L), ...``) or its per-example passkey
results and answer losses (for intervals over the evaluation sample); two controls separate a
longer context from positions past ``L``: the longest windows cut into pieces of ``L``, each
scored alone (``loss_per_window_chunk_of_longest`` on the record at ``L``), and passkey rows of
``L`` read at the positions a longer row ends at (``position_offset``); each training run and
fine-tune records its learning curve at ``L`` and at the longest length (on every ``k``-th of the
evaluation windows, :func:`curve_text`, or on the first of the evaluation's passkey examples); each
method's LM trains with the multiplier of its knob that the methods protocol study chose (``lm_mults``;
``--tuned-from`` reads them, :func:`tuned_mults`; the passkey task is not tuned, and its records
say ``"tuned": false``); the rows of a position table past ``L``, which no data reaches, are put
back to their initial values after training (``_restore_untrained_rows``; weight decay alone
had moved them, by an amount the multiplier sets); and the fine-tune without scaling, the control
of position interpolation, gets ``finetune_control_steps``. A file holding a study with other
settings is refused::

    python -m posenc.lab.experiments.extrapolation --preset protocol \
        --tuned-from book/results/protocol/methods.json --out book/results/protocol/extrapolation.json

Every option is a field of :class:`~posenc.lab.experiments.extrapolation_config.ExtrapolationStudy`
(``--train-length 64``, ``--scalings`` with no value for none, ``--no-logn``, ...); ``--preset gpu``
is the larger configuration (:data:`~posenc.lab.experiments.extrapolation_config.PRESETS`). An
interrupted run resumes: cells already in the file are not recomputed, and a cell finished on any
rank is kept even if the run was killed before rank 0 stored it (each rank first writes a finished
cell to a file of its own beside the study, :func:`pending_dir`). Only rank 0 reads and writes the
study's file, so on several machines it needs no shared file system. A rerun refuses to add records
made at another commit or dirty flag than those stored (``--allow-mixed-commits`` allows it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from tqdm.std import tqdm

from posenc.lab.data import eval_windows, load_stdlib_corpus, passkey_retrieval
from posenc.lab.experiments import distributed
from posenc.lab.experiments.compare import PROTOCOL_STUDIES, Arm, arm_grid, chosen_mult, knob_of
from posenc.lab.experiments.distributed import DistContext
from posenc.lab.experiments.extrapolation_config import PRESETS, ExtrapolationStudy, parse_mult
from posenc.lab.experiments.options import add_options, command_for, from_args
from posenc.lab.experiments.records import (RESULTS_DIR, append_records, check_provenance, finished_keys, load_records,
                                           provenance, stamp)
from posenc.lab.experiments.variants import rope_variant, scaling_config, variant
from posenc.lab.lm import LMConfig, TinyLM
from posenc.method import PositionMethod, build_method
from posenc.rope import RotaryEmbedding
from posenc.lab.train import TrainConfig, curve_steps, evaluate, evaluate_chunks, task_accuracy, train, train_task

#: The module's command, stored in the records.
COMMAND = ("python", "-m", "posenc.lab.experiments.extrapolation")


# --------------------------------------------------------------------------- models


def _config(study: ExtrapolationStudy, seed: int) -> LMConfig:
    return LMConfig(d_model=study.d_model, n_layer=study.n_layer, n_head=study.n_head, max_len=study.longest, seed=seed)


def build_position(study: ExtrapolationStudy, method: str, seed: int) -> PositionMethod:
    """``method`` built for ``L``, or, if its coverage is finite (a table, a cache), for the longest length.

    Seeded by ``seed`` (the global RNG is untouched).

    Raises:
        ValueError: if ``method`` is not registered.
    """
    config = _config(study, seed)

    def build(max_len: int) -> PositionMethod:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build_method(method, dataclasses.replace(config, max_len=max_len))

    position = build(study.train_length)
    if position.max_positions is not None and position.max_positions < study.longest:
        position = build(study.longest)  # a table or cache: cover every evaluated position
    return position


def build_model(study: ExtrapolationStudy, method: str, seed: int, device: str | torch.device = "cpu") -> TinyLM:
    """The untrained model of one cell, seeded by ``seed``, with the position of :func:`build_position`.

    Raises:
        ValueError: if ``method`` is not registered.
    """
    return TinyLM(_config(study, seed), build_position(study, method, seed)).to(device)


def _tables(position: PositionMethod) -> dict[str, torch.nn.Parameter]:
    """The position tables of ``position``: its parameters with ``max_positions`` rows, by name."""
    n = position.max_positions
    return {k: p for k, p in position.named_parameters() if n is not None and p.dim() >= 1 and p.shape[0] == n}


def _untrained_rows(position: PositionMethod, trained: int) -> int:
    """Rows of a position table (a parameter with ``max_positions`` rows) that training at ``trained`` never reaches."""
    return position.max_positions - trained if _tables(position) else 0


def _restore_untrained_rows(position: PositionMethod, initial: dict[str, torch.Tensor], trained: int) -> dict[str, float]:
    """Put the rows from ``trained`` on of each table back to their initial values; return the norm
    of those rows after training over their initial norm, per table.

    No data gradient reaches those rows; AdamW's weight decay alone shrinks them, by
    ``prod(1 - lr_t * weight_decay)`` over the run, and a larger learning rate of the position
    parameters shrinks them further (to 0.1 % of their size over 4,000 steps at 10 times the rate,
    against 52 % at 1). Restoring them is exactly training them without weight decay (with no
    gradient, Adam's own step is zero), so that what a method does past ``L`` does not depend on the
    multiplier its tuning chose."""
    ratios = {}
    with torch.no_grad():
        for name, p in _tables(position).items():
            ratios[name] = round(float(p[trained:].norm() / initial[name][trained:].norm()), 6)
            p[trained:] = initial[name][trained:]
    return ratios


# --------------------------------------------------------------------------- training


def _passkey(study: ExtrapolationStudy, length: int, depth: Optional[float] = None) -> Callable:
    """``task(batch_size, generator)`` of passkey rows whose inputs are ``length`` tokens."""
    return lambda batch_size, generator: passkey_retrieval(batch_size, length + 1, generator,
                                                           num_digits=study.passkey_digits, depth=depth)


def _fit(study: ExtrapolationStudy, model: TinyLM, task: str, cfg: TrainConfig, ddp: Optional[DistContext],
         curve: bool = False, stop_after: Optional[int] = None):
    """Train ``model`` on ``task`` with ``cfg``, data-parallel over ``ddp``'s ranks if given; with
    ``curve``, measured after ``curve_points`` evenly spaced steps (:func:`_curve_measure`); with
    ``stop_after``, only the first steps of ``cfg``'s schedule."""
    curve_at = curve_steps(cfg.steps, study.curve_points) if curve else ()
    measure = _curve_measure(study, task) if curve else None
    if task == "lm":
        data = load_stdlib_corpus().train
        fit = lambda m, shard: train(m, data, cfg, shard=shard, curve_at=curve_at, measure=measure,  # noqa: E731
                                     stop_after=stop_after)
    else:
        sampler = _passkey(study, cfg.seq_len)
        fit = lambda m, shard: train_task(m, sampler, cfg, shard=shard, curve_at=curve_at, measure=measure,  # noqa: E731
                                          stop_after=stop_after)
    return distributed.train_data_parallel(model, fit, ddp or DistContext())


def curve_text(study: ExtrapolationStudy, val: torch.Tensor) -> torch.Tensor:
    """The text of the LM learning curve: every ``k``-th of the study's evaluation windows, from the
    first, ``k = eval_windows // curve_windows``, ``curve_windows`` of them, laid end to end.

    Each window is ``span + 1`` tokens, ``span`` the longest evaluation length (a window and its
    targets, as :func:`~posenc.lab.data.eval_windows` places it for every length). Scored with
    ``evaluate(model, text, n, num_windows=curve_windows, span=span)``, the windows start at
    ``i * (span + 1)`` exactly, so the curve is measured on these windows of the evaluation (at every
    length ``n``, their prefixes), and its last point and the final score are on the same text.

    Args:
        study: its ``eval_windows``, ``curve_windows`` and longest evaluation length.
        val: ``(N,)`` the validation token ids the evaluation reads.

    Returns:
        ``(curve_windows * (span + 1),)`` token ids.

    Raises:
        ValueError: if ``curve_windows`` exceeds ``eval_windows``.
    """
    if study.curve_windows > study.eval_windows:
        raise ValueError(f"curve_windows={study.curve_windows} must be <= eval_windows={study.eval_windows}: the curve "
                         "is measured on a subset of the evaluation windows")
    span = study.eval_lengths[-1]
    x, y = eval_windows(val, span, study.eval_windows, span=span)  # (eval_windows, span) each
    every = study.eval_windows // study.curve_windows
    windows = torch.cat([x[:, :1], y], 1)[::every][:study.curve_windows]  # (curve_windows, span + 1)
    return windows.reshape(-1)


def _curve_measure(study: ExtrapolationStudy, task: str) -> Callable:
    """What a protocol run measures along its training, at ``L`` and at the longest length: the LM
    loss on ``curve_windows`` of the study's evaluation windows, every ``eval_windows //
    curve_windows``-th from the first (:func:`curve_text`), or the passkey exact match and answer
    loss on the study's first ``curve_examples`` examples at every depth (the first of the examples
    its evaluation scores: the same generator and seed)."""
    lengths = (study.train_length, study.eval_lengths[-1])
    if task == "lm":
        text = curve_text(study, load_stdlib_corpus().val)

        def measure(m):
            return {f"val_loss_{n}": round(evaluate(m, text, n, num_windows=study.curve_windows, batch_size=study.eval_batch,
                                                    span=study.eval_lengths[-1]).loss, 5) for n in lengths}
        return measure

    def measure(m):
        out = {}
        for n in lengths:
            scores = [task_accuracy(m, _passkey(study, n, float(d)), num_examples=study.curve_examples,
                                    batch_size=study.eval_batch) for d in study.depths]
            out[f"exact_match_{n}"] = round(sum(a.exact_match for a in scores) / len(scores), 5)
            out[f"answer_loss_{n}"] = round(sum(a.answer_loss for a in scores) / len(scores), 5)
        return out
    return measure


def _train_record(study: ExtrapolationStudy, model: TinyLM, history, cfg: TrainConfig, **fields) -> dict:
    return {"kind": "train", **fields, "steps": cfg.steps, "batch_size": cfg.batch_size, "length": cfg.seq_len,
            "lr": cfg.lr, "train_loss_last": history.losses[-1],
            "train_loss_every_10": [round(x, 4) for x in history.smoothed(10)[9::10]],
            "position_parameters": sum(p.numel() for p in model.position.parameters()),
            "position_covers": model.position.max_positions, "untrained_table_rows":
            _untrained_rows(model.position, study.train_length), "seconds": round(history.seconds, 2)}


# --------------------------------------------------------------------------- evaluation


def _evaluate(study: ExtrapolationStudy, model: TinyLM, task: str, length: int, position_offset: int = 0) -> list[dict]:
    """Scores of ``model`` at one length: the LM loss, or the passkey accuracy at every depth (with
    ``position_offset``, rows of ``length`` read that far into the sequence)."""
    if task == "lm":
        # under the protocol every length scores prefixes of the same windows (placed for the longest)
        span = study.eval_lengths[-1] if study.protocol else None
        bands = [n for n in study.eval_lengths if n < length] if study.protocol else ()
        result = evaluate(model, load_stdlib_corpus().val, length, num_windows=study.eval_windows,
                          batch_size=study.eval_batch, span=span, bands=bands)
        score = {"depth": None, "loss": result.loss,
                 "loss_per_position": [round(x, 4) for x in result.loss_per_position.tolist()]}
        if study.protocol:
            score["loss_per_window"] = [round(x, 5) for x in result.loss_per_window.tolist()]
            if bands:  # per window, the mean loss over [0, L), [L, 2L), [2L, 4L), ... up to this length
                score["loss_per_window_band"] = [[round(x, 5) for x in row] for row in result.loss_per_window_band.tolist()]
        return [score]
    out = []
    for depth in study.depths:
        acc = task_accuracy(model, _passkey(study, length, float(depth)), num_examples=study.eval_examples,
                            batch_size=study.eval_batch, position_offset=position_offset)
        out.append({"depth": float(depth), "exact_match": acc.exact_match, "token_accuracy": acc.token_accuracy,
                    "answer_loss": acc.answer_loss, "num_examples": acc.num_examples})
        if study.protocol:  # the same examples for every method (task_accuracy's own seed)
            out[-1]["row_exact"] = "".join(str(v) for v in acc.row_exact)
            out[-1]["row_answer_loss"] = [round(x, 4) for x in acc.row_answer_loss]
    return out


def evaluation_plan(study: ExtrapolationStudy, model: TinyLM, task: str = "lm") -> list[dict]:
    """What a freshly trained model is evaluated with: ``{"logn", "scaling", "factor", "eval_length"}`` each.

    Plain at every length; log-n past ``L`` (if ``study.logn``); for a RoPE model, each zero-shot
    scaling past ``L`` with ``factor = eval_length / L``. (Both variants are the identity at ``L``.)
    Under the protocol, for the passkey, also rows of ``L`` read at ``position_offset = n - L`` for
    each longer length ``n``: the positions a row of ``n`` ends at, without its longer context.
    """
    L = study.train_length
    plan = [{"logn": False, "scaling": "none", "factor": 1.0, "eval_length": n} for n in study.eval_lengths]
    longer = [n for n in study.eval_lengths if n > L]
    if study.logn:
        plan += [{"logn": True, "scaling": "none", "factor": 1.0, "eval_length": n} for n in longer]
    if isinstance(model.position, RotaryEmbedding):
        plan += [{"logn": False, "scaling": s, "factor": n / L, "eval_length": n}
                 for s in study.scalings for n in longer]
    if study.protocol and task == "passkey":  # the control: rows of L at the positions a row of n ends at
        plan += [{"logn": False, "scaling": "none", "factor": 1.0, "eval_length": L, "position_offset": n - L}
                 for n in longer]
    return plan


def _run_plan(study, model, task, plan, base: dict, ddp: Optional[DistContext]) -> list[dict]:
    """Evaluate ``model`` for every entry of ``plan`` (dealt to the ranks under ``ddp``, gathered on rank 0)."""
    ctx = ddp or DistContext()
    mine = [p for i, p in enumerate(plan) if i % ctx.world_size == ctx.rank]
    records = []
    for entry in mine:
        evaluated = model
        if entry["scaling"] != "none" and base.get("finetune") is None:
            scaling = scaling_config(entry["scaling"], entry["factor"], study.train_length)
            evaluated = rope_variant(model, scaling, entry["eval_length"])
        if entry["logn"]:
            evaluated = variant(evaluated, logn_length=study.train_length)
        for score in _evaluate(study, evaluated, task, entry["eval_length"], entry.get("position_offset", 0)):
            records.append({"kind": "eval", **base, **entry, **score})
    gathered = distributed.gather_to_main(records, ctx)
    return [] if gathered is None else [r for part in gathered for r in part]


# --------------------------------------------------------------------------- cells


def run_cell(study: ExtrapolationStudy, method: str, seed: int, task: str, *, device: str | torch.device = "cpu",
             ddp: Optional[DistContext] = None, progress: bool = False, return_model: bool = False,
             stop_after: Optional[int] = None):
    """Train one model and evaluate it (and, for RoPE, fine-tune and evaluate each fine-tune scaling).

    Args:
        study: the grid and scale.
        method: a registered method name.
        seed: seeds the initialisation and the data order.
        task: ``"lm"`` or ``"passkey"``.
        device: where to train and evaluate.
        ddp: train data-parallel over this context's ranks (``None``: this process alone); the
            evaluations are dealt to the ranks too, and only rank 0 gets the records.
        progress: show tqdm bars for the training loops.
        return_model: also return the trained model (before any fine-tune), e.g. to inspect its attention.
        stop_after: train only the first ``stop_after`` steps of the cell's schedule (of its
            ``lm_steps`` or ``passkey_steps``) and return the training record so far, with
            ``"stopped_after"``: its ``train_loss_every_10`` over those steps and, under the protocol,
            the curve's points up to there, which are those of the whole run (the same seed, data and
            learning-rate schedule), so a live check of a stored record
            (:func:`~posenc.lab.experiments.records.check_rerun`) takes a fraction of the time. No
            evaluation and no fine-tune is run.

    Returns:
        The cell's records (unstamped): training records first, then evaluation records (with
        ``stop_after``, the training record alone). Empty on ranks other than 0 under ``ddp``. With
        ``return_model``, ``(records, model)``.

    Raises:
        ValueError: for an unknown ``task`` or ``method``, or a ``stop_after`` that is not ``None``
            or an int in ``1 ..`` the cell's steps.
    """
    if task not in study.tasks:
        raise ValueError(f"task must be one of the study's tasks {study.tasks}, got {task!r}")
    if method not in study.method_names:
        raise ValueError(f"method must be one of the study's methods {study.method_names}, got {method!r}")
    steps, batch = (study.lm_steps, study.lm_batch) if task == "lm" else (study.passkey_steps, study.passkey_batch)
    if stop_after is not None and (isinstance(stop_after, bool) or not isinstance(stop_after, int)
                                   or not 1 <= stop_after <= steps):
        raise ValueError(f"stop_after must be None or an int in 1..{steps} (the study's {task} steps), "
                         f"got {stop_after!r}")
    start = time.perf_counter()
    L = study.train_length
    base = {"cell": cell_id(method, seed, task), "method": method, "seed": seed, "task": task, "trained_length": L}
    model = build_model(study, method, seed, device)
    mult, knob = study.mult(method, task), knob_of(Arm(method, method), model.position)
    if knob is None and mult != 1:
        raise ValueError(f"method {method!r} has no knob to tune (no position parameters, no code scale), so its "
                         f"multiplier must be 1, got {mult!r}")
    if knob == "code_scale" and mult != 1:
        model.position.scale = model.position.scale * mult
    cfg = TrainConfig(steps=steps, batch_size=batch, seq_len=L, lr=study.lr, warmup_steps=study.warmup_steps,
                      seed=seed, progress=progress, position_lr_mult=mult if knob == "position_lr" else 1.0)
    if study.protocol:
        listed = {name for name, _ in map(parse_mult, study.lm_mults if task == "lm" else study.passkey_mults)}
        base.update(knob=knob, mult=mult, tuned=method in listed)
        initial_tables = {k: p.detach().clone() for k, p in _tables(model.position).items()}
    history = _fit(study, model, task, cfg, ddp, curve=study.protocol, stop_after=stop_after)
    records = [_train_record(study, model, history, cfg, **base, finetune=None, scaling="none", factor=1.0)]
    if study.protocol:
        records[0]["curve"] = history.curve
        if initial_tables:
            records[0]["untrained_rows_norm_ratio"] = _restore_untrained_rows(model.position, initial_tables, L)
            records[0]["untrained_rows_restored"] = True
    if task == "lm":
        records[0]["corpus"] = load_stdlib_corpus().fingerprint

    def finish(records: list[dict]):
        records[0]["cell_seconds"] = round(time.perf_counter() - start, 2)
        records = records if ddp is None or ddp.is_main else []
        return (records, model) if return_model else records

    if stop_after is not None:
        records[0]["stopped_after"] = stop_after
        return finish(records)
    records += _run_plan(study, model, task, evaluation_plan(study, model, task), {**base, "finetune": None}, ddp)
    if study.protocol and task == "lm" and (ddp is None or ddp.is_main):
        # the control: the longest windows cut into pieces of L, each scored alone (evaluate_chunks)
        chunks = evaluate_chunks(model, load_stdlib_corpus().val, study.eval_lengths[-1], L,
                                 num_windows=study.eval_windows, batch_size=study.eval_batch)
        at_L = next(r for r in records if r["kind"] == "eval" and r["eval_length"] == L and not r["logn"]
                    and r["scaling"] == "none" and r.get("position_offset") is None)
        at_L["loss_per_window_chunk_of_longest"] = [[round(x, 5) for x in row] for row in chunks.tolist()]
    if isinstance(model.position, RotaryEmbedding) and study.finetune_steps > 0:
        n = study.finetune_window
        ft_cfg = TrainConfig(steps=study.finetune_steps, batch_size=study.finetune_batch or max(1, batch * L // n),
                             seq_len=n, lr=study.finetune_lr, warmup_steps=study.finetune_steps // 10, seed=seed,
                             progress=progress)
        for name in study.finetune_scalings:
            factor = 1.0 if name == "default" else n / L  # "default": the control, RoPE unscaled
            tuned = rope_variant(model, scaling_config(name, factor, L), study.longest)
            cfg_name = ft_cfg
            if name == "default" and study.finetune_control_steps is not None:
                cfg_name = dataclasses.replace(ft_cfg, steps=study.finetune_control_steps,
                                               warmup_steps=study.finetune_control_steps // 10)
            ft_history = _fit(study, tuned, task, cfg_name, ddp, curve=study.protocol)
            ft = {**base, "finetune": name, "scaling": name, "factor": factor}
            records.append(_train_record(study, tuned, ft_history, cfg_name, **ft))
            if study.protocol:
                records[-1]["curve"] = ft_history.curve
            plan = [{"logn": False, "scaling": name, "factor": factor, "eval_length": m} for m in study.eval_lengths]
            records += _run_plan(study, tuned, task, plan, {**base, "finetune": name}, ddp)
    return finish(records)


def cell_id(method: str, seed: int, task: str) -> str:
    """The identifier of a cell in the records: ``"METHOD|SEED|TASK"``."""
    return f"{method}|{seed}|{task}"


def record_key(record: dict) -> tuple:
    """What identifies a record: kind, method, seed, task, log-n, scaling, fine-tune, length, depth, position offset."""
    return tuple(record.get(k) for k in ("kind", "method", "seed", "task", "logn", "scaling", "finetune",
                                         "eval_length", "depth", "position_offset"))


def cell_cost(study: ExtrapolationStudy, method: str, task: str) -> float:
    """A rough cost of a cell in token-steps (training, fine-tunes, evaluations), to balance the ranks."""
    L, lengths = study.train_length, study.eval_lengths
    steps, batch = (study.lm_steps, study.lm_batch) if task == "lm" else (study.passkey_steps, study.passkey_batch)
    rows = study.eval_windows if task == "lm" else study.eval_examples * len(study.depths)
    cost = 3.0 * steps * batch * L + rows * sum(lengths) * (1 + study.logn)
    if isinstance(build_position(study, method, 0), RotaryEmbedding):
        cost += rows * sum(n for n in lengths if n > L) * len(study.scalings)
        ft_batch = study.finetune_batch or max(1, batch * L // study.finetune_window)
        for name in study.finetune_scalings:
            ft_steps = study.finetune_control_steps if name == "default" and study.finetune_control_steps else study.finetune_steps
            cost += 3.0 * ft_steps * ft_batch * study.finetune_window + rows * sum(lengths)
    return cost


# --------------------------------------------------------------------------- the study


def run_study(study: ExtrapolationStudy, out: str | Path, *, device: str | torch.device = "cpu",
              ctx: Optional[DistContext] = None, ddp: bool = False, command: str = "", progress: bool = True,
              log: Callable[[str], None] = tqdm.write, allow_mixed: bool = False) -> Optional[dict]:
    """Run every cell of ``study`` that ``out`` does not hold yet, and store its records there.

    The missing cells are taken costliest first (:func:`cell_cost`) from a
    :class:`~posenc.lab.experiments.distributed.WorkQueue`: one process runs them in turn; under
    ``torchrun`` (``ctx`` with several ranks) each rank claims the next cell as soon as it is free
    and rank 0 stores the records of every finished cell. With ``ddp`` every cell is instead trained
    by all ranks together. Only rank 0 reads and writes ``out``, and a rerun skips the cells already
    stored.

    A cell is durable as soon as it finishes, on whichever rank: that rank first writes its records
    to a file of their own in :func:`pending_dir` beside ``out``, which rank 0 deletes once it has
    stored them, and which a rerun's rank 0 stores before anything else (a killed run leaves them).
    So an interrupted run loses only the cells in progress. (On several machines with no shared file
    system, a rank's pending files stay on its machine: copy them into rank 0's folder to keep them.)

    A rerun adds to ``out`` only with the settings (``_check_same_settings``) and the code
    version (commit and dirty flag, :func:`~posenc.lab.experiments.records.check_provenance`) of
    the records stored there, on every rank, unless ``allow_mixed``.

    Args:
        study: the grid and scale.
        out: the JSON file.
        device: where to train (under ``torchrun`` with CUDA, each rank uses ``ctx.device``,
            ``cuda:(LOCAL_RANK % GPUs)``).
        ctx: the distributed context (:func:`~posenc.lab.experiments.distributed.init`); ``None``: one process.
        ddp: train each cell data-parallel over all ranks.
        command: the command line, stored in every record.
        progress: show progress bars (rank 0 only).
        log: where rank 0 writes one line per finished cell.
        allow_mixed: add records made at another commit or dirty flag than those stored in ``out``
            (each record keeps its own provenance).

    Returns:
        The stored study on rank 0, ``None`` on the other ranks.

    Raises:
        ValueError: on rank 0, if ``out`` or a pending file holds a study with other settings, or
            (unless ``allow_mixed``) records of another commit or dirty flag than this run's ranks.
    """
    ctx = ctx or DistContext(device=str(device))
    device = ctx.device if ctx.distributed else device
    out = Path(out)
    origin = {**provenance(device), "rank": ctx.rank}  # read once, before training: the code this process imported
    origins = distributed.gather_to_main(origin, ctx)
    if ctx.is_main:
        _resume(study, out, origins, allow_mixed)
    done = distributed.broadcast_from_main(finished_keys(out, lambda r: r["cell"]) if ctx.is_main else None, ctx)
    todo = sorted((c for c in study.cells() if cell_id(*c) not in done), key=lambda c: -cell_cost(study, c[0], c[2]))
    bar = tqdm(total=len(todo), desc="cells", disable=not (progress and ctx.is_main))

    def store(results: list[tuple[int, list[dict]]]) -> None:
        new = [r for _, records in results for r in records]
        if new:
            append_records(out, new, record_key, lambda rs: _meta(study, rs), one_per_line=True)
        for _, records in results:  # stored: no longer pending (a file of another machine is not here)
            if records:
                _pending_file(out, records[0]["cell"]).unlink(missing_ok=True)
        for r in new:
            if r["kind"] == "train" and r["finetune"] is None:
                log(f"{r['cell']:32s} train loss {r['train_loss_last']:.4f} ({r['cell_seconds']:.0f} s, rank {r['rank']})")
        bar.update(len(results))

    if ddp:  # every rank on every cell; rank 0 has the records and stores them at once
        for cell in todo:
            records = [stamp(r, origin, command) for r in run_cell(study, *cell, device=device, ddp=ctx,
                                                                    progress=progress and ctx.is_main)]
            if ctx.is_main:
                store([(0, records)])
    else:  # each rank on its own cells, claimed as it goes
        queue = distributed.WorkQueue(ctx, len(todo), f"extrapolation/{distributed.new_name(ctx)}")
        parked = []
        while (index := queue.claim()) is not None:
            records = [stamp(r, origin, command) for r in run_cell(study, *todo[index], device=device,
                                                                    progress=progress and not ctx.distributed)]
            parked.append(park(study, out, records))  # durable now, whatever happens to this rank or rank 0
            queue.put(index, records)
            if ctx.is_main:
                store(queue.collect())
        if ctx.is_main:
            store(queue.collect(wait=True))
    bar.close()
    if ctx.distributed:
        torch.distributed.barrier()  # the others wait until rank 0 has stored everything
        if not ddp:
            for path in parked:  # stored by rank 0 by now; on a machine of its own, rank 0 could not delete it
                path.unlink(missing_ok=True)
    if ctx.is_main:
        with contextlib.suppress(OSError):  # empty once every cell is stored
            pending_dir(out).rmdir()
    return load_records(out) if ctx.is_main and out.exists() else None


def pending_dir(out: str | Path) -> Path:
    """The folder beside ``out`` where finished cells wait to be stored in it: ``OUT.pending``."""
    out = Path(out)
    return out.with_name(out.name + ".pending")


def _pending_file(out: Path, cell: str) -> Path:
    return pending_dir(out) / (cell.replace("|", "+") + ".json")


def park(study: ExtrapolationStudy, out: str | Path, records: list[dict]) -> Path:
    """Write the records of one finished cell to a file of their own in :func:`pending_dir`, until
    rank 0 stores them in ``out``.

    The file is ``{"meta": {"config": ...}, "records": [...]}`` (the settings as ``out``'s meta
    holds them), written whole or not at all (a temporary file renamed over it).

    Args:
        study: the study the records belong to.
        out: the study's JSON file.
        records: the cell's stamped records (its training record first).

    Returns:
        The file written.
    """
    path = _pending_file(Path(out), records[0]["cell"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"meta": {"config": _config_of(study)}, "records": records}))
    os.replace(tmp, path)
    return path


def _resume(study: ExtrapolationStudy, out: Path, origins: list[dict], allow_mixed: bool) -> None:
    """On rank 0, before any cell: check that this run may add to ``out`` (its settings, and the
    commit and dirty flag of ``origins``, every rank's provenance), then store the cells a killed run
    left in :func:`pending_dir` and delete their files."""
    stored = load_records(out) if out.exists() else {"meta": {}, "records": []}
    if out.exists():
        _check_same_settings(study, stored["meta"], out)
    folder = pending_dir(out)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    pending = []
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{path} is not a readable pending cell ({err}); delete it to rerun that cell") from err
        _check_same_settings(study, data["meta"], path)
        pending += data["records"]
    check_provenance(stored["records"] + pending, origins, out, allow_mixed=allow_mixed)
    if pending:
        append_records(out, pending, record_key, lambda rs: _meta(study, rs), one_per_line=True)
    for path in [*files, *(folder.glob(".*.tmp") if folder.is_dir() else ())]:  # stored, or never finished writing
        path.unlink()


#: The fields that may differ between a study and the stored file it adds to (the grid of methods, seeds and tasks).
GRID_FIELDS = ("methods", "seeds", "tasks")


def _check_same_settings(study: ExtrapolationStudy, meta: dict, out: Path) -> None:
    """Refuse to add ``study``'s cells to a file stored with other settings: a cell already there
    would be skipped as done, and the file's description rewritten with settings its records were
    not made with. Fields the stored description lacks (added to the study later) must be at their
    defaults."""
    stored = meta.get("config", {})
    defaults = dataclasses.asdict(ExtrapolationStudy())
    current = json.loads(json.dumps(dataclasses.asdict(study)))
    differ = [k for k, v in current.items() if k not in GRID_FIELDS
              and json.loads(json.dumps(stored.get(k, defaults[k]))) != v]
    if differ:
        raise ValueError(f"{out} holds a study with other settings ({', '.join(differ)}); write to another file "
                         f"(--out), or give the stored settings (its meta.command)")


def _config_of(study: ExtrapolationStudy) -> dict:
    """The settings of ``study`` as a stored file's meta holds them (the method names spelt out)."""
    return dataclasses.asdict(dataclasses.replace(study, methods=study.method_names))


def _meta(study: ExtrapolationStudy, records: list[dict]) -> dict:
    cells = [r for r in records if r["kind"] == "train" and r["finetune"] is None]
    return {
        "study": "extrapolation", "command": command_for(study, COMMAND),
        "config": _config_of(study),
        "eval_lengths": list(study.eval_lengths), "seeds": sorted({r["seed"] for r in records}),
        "cells": len(cells), "wall_seconds": round(sum(r.get("cell_seconds", 0.0) for r in cells), 1),
        "note": "meta.command rebuilds the whole study (finished cells are kept); each record carries the command, "
                "commit, dirty flag, torch version and machine of its own run. 'kind': 'train' records hold the "
                "training runs (cell_seconds: the whole cell, evaluations and fine-tunes included), 'kind': 'eval' "
                "records one evaluation each.",
    }


def tuned_mults(path: str | Path) -> tuple[str, ...]:
    """The multipliers the methods protocol study stored in ``path`` chose in its LM setting, as
    ``lm_mults`` entries, for every arm that has a knob and is a registered method as it is (the
    same model, data, optimiser and budget as this study's LM). Choices of 1 are listed too: a listed
    method was tuned (its records say ``"tuned": true``), an unlisted one was not.

    The passkey task takes none: the methods study's copy task, the nearest it has, was solved at
    every multiplier by most methods, so its choices are ties broken toward 1, not a tuning.

    Raises:
        ValueError: while the study has not chosen some arm's multiplier (a tuning run is missing).
    """
    records = load_records(path)["records"]
    study = PROTOCOL_STUDIES["methods"]
    entries = []
    for arm in study.arms:
        if arm.label != arm.method or arm.build is not None or arm_grid(study, arm) == (1.0,):
            continue  # a variant (e.g. ALiBi's bias inside the scaling), or nothing to tune
        m = chosen_mult(records, study, arm.label, "lm")
        if m is None:
            raise ValueError(f"the methods study in {path} has not chosen the multiplier of {arm.label!r} for its "
                             "'lm' setting yet (a tuning run is missing)")
        entries.append(f"{arm.method}={m:g}")
    return tuple(entries)


# --------------------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    """The command line: the run's options, then one option per field of
    :class:`~posenc.lab.experiments.extrapolation_config.ExtrapolationStudy`."""
    p = argparse.ArgumentParser(prog=" ".join(COMMAND), description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="the configuration the options change")
    p.add_argument("--out", help="output JSON (default: book/results/extrapolation.json)")
    p.add_argument("--plots", metavar="DIR", help="also write the figures (PNG) to DIR")
    p.add_argument("--device", default="cpu", help="cpu or cuda (under torchrun with cuda: process LOCAL_RANK on "
                   "cuda:(LOCAL_RANK %% GPUs), so several processes may share a GPU)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    p.add_argument("--ddp", action="store_true", help="under torchrun: train each model over all processes (DDP; "
                   "on CUDA, one GPU per process)")
    p.add_argument("--quiet", action="store_true", help="no progress bars and no log lines")
    p.add_argument("--allow-mixed-commits", action="store_true", help="add to --out records made at another "
                   "commit or dirty flag than those it holds (refused by default: a study made by several versions "
                   "of the code cannot be read as one)")
    p.add_argument("--tuned-from", metavar="JSON", help="take lm_mults from the methods protocol study stored there "
                   "(tuned_mults), e.g. book/results/protocol/methods.json")
    add_options(p.add_argument_group("study (fields of ExtrapolationStudy; default: the preset's)"),
                ExtrapolationStudy)
    return p


def study_from_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> ExtrapolationStudy:
    """The study the parsed options describe: the preset, the fields given, and ``lm_mults`` from
    ``--tuned-from`` (``p.error`` for a bad one; a protocol study must say where its multipliers
    come from: ``--tuned-from``, or ``--lm-mults``, with no value for none)."""
    try:
        study = from_args(PRESETS[args.preset], args)
        if args.tuned_from:
            if args.lm_mults is not None:
                raise ValueError("give --tuned-from or --lm-mults, not both")
            study = dataclasses.replace(study, lm_mults=tuned_mults(args.tuned_from))
        elif study.protocol and args.lm_mults is None:
            raise ValueError("a protocol study trains each method at its tuned multiplier: give --tuned-from "
                             "(e.g. book/results/protocol/methods.json), or --lm-mults with no value for the "
                             "untuned sensitivity")
        study.method_names  # noqa: B018  (raises for a name that is not registered)
    except ValueError as err:
        p.error(str(err))
    return study


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Parse the command line, run the study (under torchrun: on every rank) and, on rank 0, plot it."""
    p = parser()
    args = p.parse_args(argv)
    study = study_from_args(p, args)
    torch.set_num_threads(args.threads)
    ctx = distributed.init(args.device)
    try:
        out = Path(args.out) if args.out else RESULTS_DIR / "extrapolation.json"
        command = shlex.join([*COMMAND, *(argv if argv is not None else sys.argv[1:])])
        log = (lambda line: None) if args.quiet else tqdm.write
        data = run_study(study, out, device=args.device, ctx=ctx, ddp=args.ddp, command=command,
                         progress=not args.quiet, log=log, allow_mixed=args.allow_mixed_commits)
        if args.plots and data is not None:
            import matplotlib

            matplotlib.use("Agg")  # files only, no window
            from posenc.lab.experiments.extrapolation_plots import plot_all

            for path in plot_all(data, args.plots):
                log(f"wrote {path}")
    finally:
        distributed.shutdown(ctx)


if __name__ == "__main__":
    main()
