"""Training loop and the evaluation every experiment of the book reports.

:func:`train` is AdamW with linear warmup and cosine decay (:func:`lr_at`), gradient clipping and
a seeded data order; nothing global is read or set, so the same call works inside ``torchrun``,
and its ``shard`` argument gives each process its slice of every batch for data-parallel training
(:func:`posenc.lab.experiments.distributed.train_data_parallel`).
:func:`evaluate` returns the loss **at every token position** of windows of a given length, and
:func:`evaluate_lengths` does so for several lengths: the diagnostic curves of length
extrapolation.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import Tensor, nn
from tqdm.std import tqdm

from posenc.lab.data import Task, eval_windows, random_batch
from posenc.lab.lm import next_token_loss


@dataclass
class TrainConfig:
    """Hyper-parameters of :func:`train`."""

    steps: int = 300  #: optimiser steps
    batch_size: int = 16  #: windows per step (B)
    seq_len: int = 128  #: training context length T
    lr: float = 3e-3  #: peak learning rate
    min_lr_ratio: float = 0.1  #: final learning rate = min_lr_ratio * lr
    warmup_steps: int = 30  #: linear warmup from lr / warmup_steps to lr
    weight_decay: float = 0.1  #: AdamW decoupled weight decay, on matrices only
    betas: tuple[float, float] = (0.9, 0.95)  #: AdamW betas
    grad_clip: float = 1.0  #: max global gradient norm (0 disables clipping)
    seed: int = 0  #: seed of the data order
    progress: bool = True  #: show a tqdm progress bar
    #: multiplies the learning rate of the position method's parameters (``model.position``). Under
    #: Adam each parameter moves about one learning rate per step whatever its scale, so this is the
    #: step size of the position parameters, the knob the experiments protocol tunes per method
    position_lr_mult: float = 1.0
    #: AdamW's fused implementation (one kernel updates every parameter), the same update up to the
    #: order of floating-point operations. For the tiny LM on one CPU thread it gained 0-7 % in steps/s
    #: (benchmarks/train_throughput.py), so the studies keep the default, which stored runs used.
    fused: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"TrainConfig.warmup_steps must be an int in 0..steps={self.steps}, got {self.warmup_steps!r}")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig.lr must be > 0, got {self.lr!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"TrainConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if self.grad_clip < 0:
            raise ValueError(f"TrainConfig.grad_clip must be >= 0, got {self.grad_clip!r}")
        if not isinstance(self.fused, bool):
            raise ValueError(f"TrainConfig.fused must be a bool, got {self.fused!r}")
        if isinstance(self.position_lr_mult, bool) or not isinstance(self.position_lr_mult, (int, float)) or not self.position_lr_mult > 0:
            raise ValueError(f"TrainConfig.position_lr_mult must be a number > 0, got {self.position_lr_mult!r}")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at optimiser step ``step`` (0-based).

    ``lr * (step + 1) / warmup_steps`` during warmup, then cosine decay from ``lr`` at the end
    of warmup to ``min_lr_ratio * lr`` at the last step.

    Raises:
        ValueError: if ``step`` is outside ``0 .. cfg.steps - 1``.
    """
    if not 0 <= step < cfg.steps:
        raise ValueError(f"step must be in 0..{cfg.steps - 1}, got {step}")
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    decay_steps = cfg.steps - cfg.warmup_steps
    progress = 0.0 if decay_steps <= 1 else (step - cfg.warmup_steps) / (decay_steps - 1)
    min_lr = cfg.min_lr_ratio * cfg.lr
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


@dataclass
class TrainResult:
    """What :func:`train` recorded."""

    losses: list[float] = field(default_factory=list)  #: training loss (nats/token) at every step, penalty excluded
    penalties: list[float] = field(default_factory=list)  #: value of the penalty term at every step (0 without one)
    lrs: list[float] = field(default_factory=list)  #: learning rate used at every step
    seconds: float = 0.0  #: wall-clock time of the loop (the curve's measurements excluded)
    #: the learning curve, ``{"step": s, **measure(model)}`` after each step ``s`` of ``curve_at``
    curve: list[dict] = field(default_factory=list)

    def smoothed(self, window: int = 20) -> list[float]:
        """Running mean of the training loss over the last ``window`` steps.

        Raises:
            ValueError: if ``window`` is not a positive int.
        """
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        out, total = [], 0.0
        for i, loss in enumerate(self.losses):
            total += loss - (self.losses[i - window] if i >= window else 0.0)
            out.append(total / min(i + 1, window))
        return out


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def train(
    model: nn.Module, data: Tensor, cfg: TrainConfig, *, penalty: Optional[Callable[[], Tensor]] = None,
    shard: tuple[int, int] = (0, 1), curve_at: Sequence[int] = (), measure: Optional[Callable[[nn.Module], dict]] = None,
    stop_after: Optional[int] = None,
) -> TrainResult:
    """Train ``model`` on random windows of ``data`` for next-token prediction.

    Runs on the model's device. With the same model initialisation, data and ``cfg`` the run is
    bit-for-bit repeatable on CPU. Only parameters with ``requires_grad`` are optimised, so
    freezing a parameter before the call keeps it fixed.

    Args:
        model: a :class:`~posenc.lab.lm.TinyLM` (any module mapping ``(B, T)`` ids to ``(B, T, V)`` logits).
        data: ``(N,)`` token ids (e.g. ``load_stdlib_corpus().train``).
        cfg: hyper-parameters.
        penalty: optional regulariser, called with no arguments at every step; the scalar tensor it
            returns is added to the loss before the backward pass, e.g.
            ``lambda: 0.01 * difference_penalty(model.position.table())`` (source 000, eqs.
            6.3.22-6.3.24). The recorded ``losses`` exclude it; ``penalties`` records it.
        shard: ``(rank, world_size)`` for data-parallel training: this process computes its slice
            (:func:`batch_rows`) of every global batch of ``cfg.batch_size`` windows, and its loss is
            its share of the batch's mean, so that the mean over the processes of their losses and
            gradients (what ``torch.nn.parallel.DistributedDataParallel`` computes) is the loss and
            gradient of the whole batch. ``(0, 1)``, the default, is ordinary training.
        curve_at: steps (1-based counts of optimiser steps, each in ``1 .. cfg.steps``) after which
            ``measure(model)`` is called (in eval mode); its dict, with ``"step"``, is appended to ``curve``. The
            measurements draw no random numbers from the training stream, so the training is the
            same with or without them.
        measure: e.g. ``lambda m: {"val_loss": evaluate(m, corpus.val, 128, num_windows=64).loss}``.
        stop_after: stop after this many steps of ``cfg``'s schedule (``None``: all ``cfg.steps``):
            the first steps of a longer run, exactly, to reproduce a point of a stored curve quickly.

    Returns:
        The per-step losses, penalties and learning rates, and the curve. The model is left in eval mode.

    Raises:
        ValueError: if ``cfg.seq_len`` exceeds the model's ``config.max_len``, ``shard`` is not a
            valid ``(rank, world_size)`` whose ``world_size`` divides ``cfg.batch_size``, or
            ``curve_at`` has steps outside ``1 .. cfg.steps`` or is given without ``measure``.
        TypeError: if ``data`` is not a 1-D tensor, or ``penalty`` is not callable or returns
            something other than a scalar tensor.
    """
    if not isinstance(data, Tensor) or data.dim() != 1:
        raise TypeError(f"data must be a 1-D tensor of token ids, got {type(data).__name__}")

    def next_batch(generator: torch.Generator, device: torch.device) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        x, y = random_batch(data, cfg.batch_size, cfg.seq_len, generator, device=device)
        return x, y, None

    return _fit(model, cfg, next_batch, penalty, seq_len=cfg.seq_len, shard=shard, curve_at=curve_at, measure=measure,
                stop_after=stop_after)


def train_task(
    model: nn.Module, task: Callable[[int, torch.Generator], Task], cfg: TrainConfig, *,
    penalty: Optional[Callable[[], Tensor]] = None, shard: tuple[int, int] = (0, 1),
    curve_at: Sequence[int] = (), measure: Optional[Callable[[nn.Module], dict]] = None,
    stop_after: Optional[int] = None,
) -> TrainResult:
    """Train ``model`` on a synthetic task, scoring only the answer tokens.

    The loss is the mean cross-entropy over the positions where :attr:`posenc.lab.data.Task.mask` is True, so the
    model is not asked to predict the random part of the input (which carries no signal). Every
    step draws a fresh batch from ``task(cfg.batch_size, generator)``; ``cfg.seq_len`` is ignored
    (the task fixes the length). Same optimiser, schedule and repeatability as :func:`train`.

    Args:
        model: maps ``(B, T)`` ids to ``(B, T, V)`` logits.
        task: e.g. ``functools.partial(posenc.lab.data.copy_task, length=24)``, called as
            ``task(batch_size, generator)`` and returning a :class:`~posenc.lab.data.Task`.
        cfg: hyper-parameters; ``seed`` seeds the stream of examples.
        penalty: optional regulariser added to the loss, as in :func:`train`.
        shard: ``(rank, world_size)`` for data-parallel training, as in :func:`train`.
        curve_at, measure: the learning curve, as in :func:`train` (e.g. ``measure`` returning
            :func:`task_accuracy` on held-out examples).
        stop_after: stop early on the same schedule, as in :func:`train`.

    Returns:
        The per-step losses (nats per answer token), learning rates and curve. The model is left in eval mode.

    Raises:
        TypeError: if ``task`` is not callable or does not return a :class:`~posenc.lab.data.Task`.
        ValueError: if the task's sequences are longer than the model's ``config.max_len``, or for a
            bad ``shard``.
    """
    if not callable(task):
        raise TypeError(f"task must be a callable (batch_size, generator) -> Task, got {type(task).__name__}")

    def next_batch(generator: torch.Generator, device: torch.device) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        batch = task(cfg.batch_size, generator)
        if not isinstance(batch, Task):
            raise TypeError(f"task must return a posenc.lab.data.Task, got {type(batch).__name__}")
        _check_length(model, batch.inputs.shape[1], "the task's sequence length")
        return batch.inputs.to(device), batch.targets.to(device), batch.mask.to(device)

    return _fit(model, cfg, next_batch, penalty, seq_len=None, shard=shard, curve_at=curve_at, measure=measure,
                stop_after=stop_after)


def batch_rows(batch_size: int, rank: int, world_size: int) -> slice:
    """The rows of a global batch that rank ``rank`` of ``world_size`` computes: equal, contiguous slices.

    Args:
        batch_size: ``B``, the rows of the global batch.
        rank: this process's index, ``0 .. world_size - 1``.
        world_size: the number of processes sharing the batch.

    Returns:
        ``slice(rank * B / world_size, (rank + 1) * B / world_size)``.

    Raises:
        ValueError: if ``world_size`` does not divide ``batch_size`` (unequal slices would weight the
            ranks' losses unequally), or ``rank`` is out of range.
    """
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, world_size))
    if not ints or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"shard must be (rank, world_size) with 0 <= rank < world_size, got ({rank!r}, {world_size!r})")
    if batch_size % world_size:
        raise ValueError(
            f"batch_size={batch_size} must be divisible by the number of processes, world_size={world_size}")
    per = batch_size // world_size
    return slice(rank * per, (rank + 1) * per)


def _check_length(model: nn.Module, length: int, what: str) -> None:
    model = getattr(model, "module", model)  # a DistributedDataParallel wrapper holds the model
    max_len = getattr(getattr(model, "config", None), "max_len", None)
    if max_len is not None and length > max_len:
        raise ValueError(f"{what}={length} exceeds the model's max_len={max_len}")


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """AdamW's parameter groups: weight decay on matrices only, and the position method's
    parameters (``model.position``, also inside a ``DistributedDataParallel`` wrapper) at
    ``cfg.position_lr_mult`` times the learning rate (``"lr_mult"`` of each group).

    Only parameters with ``requires_grad`` are included; empty groups are left out.
    """
    inner = getattr(model, "module", model)
    position = getattr(inner, "position", None)
    in_position = {id(p) for p in position.parameters()} if isinstance(position, nn.Module) else set()
    groups = []
    for is_pos in (False, True):
        for decay in (True, False):
            params = [p for p in model.parameters()
                      if p.requires_grad and (id(p) in in_position) == is_pos and (p.dim() >= 2) == decay]
            if params:
                groups.append({"params": params, "weight_decay": cfg.weight_decay if decay else 0.0,
                               "lr_mult": cfg.position_lr_mult if is_pos else 1.0})
    return groups


def curve_steps(steps: int, points: int) -> list[int]:
    """``points`` evenly spaced steps of a run of ``steps`` (after ``S/points, 2S/points, ..., S``),
    for ``curve_at`` of :func:`train` and :func:`train_task`."""
    return sorted({max(1, round(steps * i / points)) for i in range(1, points + 1)})


def _check_curve(curve_at: Sequence[int], measure, steps: int) -> list[int]:
    at = sorted(set(curve_at))
    if at and measure is None:
        raise ValueError("curve_at needs a measure(model) -> dict to call at those steps")
    if measure is not None and not callable(measure):
        raise TypeError(f"measure must be callable, got {type(measure).__name__}")
    bad = [s for s in at if not (isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= steps)]
    if bad:
        raise ValueError(f"curve_at must hold steps in 1..{steps}, got {bad}")
    return at


def _fit(model, cfg, next_batch, penalty, seq_len, shard=(0, 1), curve_at=(), measure=None, stop_after=None) -> TrainResult:
    """The optimisation loop shared by :func:`train` and :func:`train_task`.

    With ``shard = (rank, world_size)``, ``world_size > 1``, every process draws the same global
    batch (the generator is seeded by ``cfg.seed`` alone) and computes the rows :func:`batch_rows`
    gives it. Its loss is the sum over its scored tokens divided by ``N / world_size``, ``N`` the
    scored tokens of the whole batch: the mean of the processes' losses, and of their gradients
    (what ``DistributedDataParallel`` computes), is then the loss and gradient of the whole batch,
    whatever the number of scored tokens per row.
    """
    if not isinstance(shard, tuple) or len(shard) != 2:
        raise ValueError(f"shard must be a tuple (rank, world_size), got {shard!r}")
    rows = batch_rows(cfg.batch_size, *shard)
    world_size = shard[1]
    if seq_len is not None:
        _check_length(model, seq_len, "cfg.seq_len")
    if penalty is not None and not callable(penalty):
        raise TypeError(f"penalty must be a callable returning a scalar tensor, or None, got {type(penalty).__name__}")
    at = _check_curve(curve_at, measure, cfg.steps)
    if stop_after is not None and not (isinstance(stop_after, int) and not isinstance(stop_after, bool)
                                       and 1 <= stop_after <= cfg.steps):
        raise ValueError(f"stop_after must be an int in 1..{cfg.steps} or None, got {stop_after!r}")
    at = [s for s in at if stop_after is None or s <= stop_after]
    device = _device_of(model)
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=cfg.betas, **({"fused": True} if cfg.fused else {}))
    result = TrainResult()
    model.train()
    start = time.perf_counter()
    measuring = 0.0
    bar = tqdm(range(cfg.steps if stop_after is None else stop_after), disable=not cfg.progress, desc="train", leave=False)
    for step in bar:
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_mult"]
        x, y, mask = next_batch(generator, device)
        if world_size > 1:
            scored = y.numel() if mask is None else int(mask.sum())  # N, over the whole batch
            x, y, mask = x[rows], y[rows], None if mask is None else mask[rows]  # this process's rows
            per_token = next_token_loss(model(x), y, reduction="none")  # (B / world_size, T)
            loss = (per_token if mask is None else per_token[mask]).sum() / (scored / world_size)
        elif mask is None:
            loss = next_token_loss(model(x), y)
        else:
            loss = next_token_loss(model(x), y, reduction="none")[mask].mean()
        extra = _penalty_value(penalty) if penalty is not None else None
        optimizer.zero_grad(set_to_none=True)
        (loss if extra is None else loss + extra).backward()
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        result.losses.append(loss.item())
        result.penalties.append(0.0 if extra is None else extra.item())
        result.lrs.append(lr)
        if cfg.progress and step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if at and step + 1 == at[0]:
            at.pop(0)
            t0 = time.perf_counter()
            model.eval()
            with torch.random.fork_rng(devices=[]):  # a measure that draws random numbers leaves training alone
                point = {"step": step + 1, **measure(model)}
            result.curve.append(point)
            model.train()
            measuring += time.perf_counter() - t0
    result.seconds = time.perf_counter() - start - measuring
    model.eval()
    return result


def _penalty_value(penalty: Callable[[], Tensor]) -> Tensor:
    value = penalty()
    if not isinstance(value, Tensor) or value.numel() != 1:
        got = f"shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
        raise TypeError(f"penalty must return a scalar tensor, got {got}")
    return value.reshape(())


@dataclass
class EvalResult:
    """Loss of a model on windows of one length."""

    seq_len: int  #: window length T
    num_windows: int  #: windows averaged
    loss_per_position: Tensor  #: (T,) mean loss (nats) of the prediction made at each position
    #: ``(num_windows,)``, the mean loss of each window (the items a bootstrap of the evaluation sample resamples)
    loss_per_window: Optional[Tensor] = None
    #: ``(num_windows, bands)``, the mean loss of each window over each band of positions (see ``bands`` of :func:`evaluate`)
    loss_per_window_band: Optional[Tensor] = None

    @property
    def loss(self) -> float:
        """Mean loss over all positions (nats/token)."""
        return float(self.loss_per_position.mean())


@torch.no_grad()
def evaluate(
    model: nn.Module, data: Tensor, seq_len: int, *, num_windows: int = 32, batch_size: int = 16,
    span: Optional[int] = None, between: bool = False, bands: Sequence[int] = (),
) -> EvalResult:
    """Loss at every position of ``num_windows`` evenly spaced windows of length ``seq_len``.

    Args:
        model: maps ``(B, T)`` ids to ``(B, T, V)`` logits; run on its own device in eval mode.
        data: ``(N,)`` token ids (e.g. the validation split).
        seq_len: window length ``T``; may exceed the training length (extrapolation).
        num_windows: number of windows averaged (deterministic positions in ``data``).
        batch_size: windows per forward pass.
        span: place the windows as for length ``span`` (:func:`~posenc.lab.data.eval_windows`), so that
            evaluations at several lengths up to ``span`` score prefixes of the same windows.
        between: score the ``num_windows - 1`` windows halfway between those windows instead
            (:func:`~posenc.lab.data.eval_windows`): held-out text for choosing a setting.
        bands: increasing positions ``b_1 < b_2 < ...`` that cut the window into the bands
            ``[0, b_1), [b_1, b_2), ..., [b_k, T)`` (those below ``T``); the mean loss of each window
            over each band is returned as ``loss_per_window_band``.

    Returns:
        :class:`EvalResult` with ``loss_per_position`` of shape ``(T,)``, ``loss_per_window`` and,
        with ``bands``, ``loss_per_window_band``.

    Raises:
        ValueError: if ``data`` is too short, or from the model if ``seq_len`` is beyond what its
            position method covers.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    device = _device_of(model)
    was_training = model.training
    model.eval()
    bands = list(bands)
    if any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in bands) or bands != sorted(set(bands)):
        raise ValueError(f"bands must be increasing positive ints, got {bands!r}")
    edges = [0, *(b for b in bands if b < seq_len), seq_len]
    x_all, y_all = eval_windows(data, seq_len, num_windows, span=span, between=between)
    num_windows = x_all.shape[0]
    total = torch.zeros(seq_len, dtype=torch.float64)
    per_window, per_band = [], []
    try:
        for i in range(0, num_windows, batch_size):
            x, y = x_all[i : i + batch_size].to(device), y_all[i : i + batch_size].to(device)
            loss = next_token_loss(model(x), y, reduction="none")  # (b, T)
            total += loss.sum(0).double().cpu()  # (T,)
            per_window.append(loss.double().mean(1).cpu())  # (b,)
            if bands:
                per_band.append(torch.stack([loss[:, lo:hi].double().mean(1).cpu() for lo, hi in zip(edges, edges[1:])], 1))
    finally:
        model.train(was_training)
    return EvalResult(seq_len=seq_len, num_windows=num_windows, loss_per_position=(total / num_windows).float(),
                      loss_per_window=torch.cat(per_window).float(),
                      loss_per_window_band=torch.cat(per_band).float() if bands else None)


@torch.no_grad()
def evaluate_chunks(
    model: nn.Module, data: Tensor, span: int, chunk: int, *, num_windows: int = 32, batch_size: int = 16,
) -> Tensor:
    """The windows :func:`evaluate` scores at length ``span``, cut into pieces of ``chunk`` tokens
    and each piece scored alone, from position 0.

    With ``evaluate(model, data, span, span=span, bands=(chunk, 2 * chunk, ...))`` this scores the
    same tokens (with the same targets) twice: in the long window, with everything before them as
    context and at positions past ``chunk``, and alone, as a model trained on ``chunk``-token windows
    saw text. Their difference, window by window, is what the long window costs or gains.

    Returns:
        ``(num_windows, span // chunk)``: the mean loss of each piece.

    Raises:
        ValueError: if ``chunk`` does not divide ``span``.
    """
    if not isinstance(chunk, int) or chunk < 1 or span % chunk:
        raise ValueError(f"chunk must be a positive int that divides span={span}, got {chunk!r}")
    device = _device_of(model)
    was_training = model.training
    model.eval()
    x_all, y_all = eval_windows(data, span, num_windows, span=span)
    x_all, y_all = x_all.reshape(-1, chunk), y_all.reshape(-1, chunk)  # (num_windows * pieces, chunk)
    losses = []
    try:
        for i in range(0, x_all.shape[0], batch_size):
            x, y = x_all[i : i + batch_size].to(device), y_all[i : i + batch_size].to(device)
            losses.append(next_token_loss(model(x), y, reduction="none").double().mean(1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(losses).reshape(-1, span // chunk).float()


def evaluate_lengths(
    model: nn.Module, data: Tensor, lengths: Iterable[int], *, num_windows: int = 32, batch_size: int = 16,
    nested: bool = False,
) -> dict[int, EvalResult]:
    """:func:`evaluate` at each window length in ``lengths`` (e.g. 1x, 2x, 4x the training length).

    With ``nested=True`` every length is scored on prefixes of the same windows (spaced for the
    longest length), so that a difference between lengths is not a difference of text.
    """
    lengths = [int(n) for n in lengths]
    span = max(lengths) if nested and lengths else None
    return {n: evaluate(model, data, n, num_windows=num_windows, batch_size=batch_size, span=span) for n in lengths}


@dataclass
class TaskAccuracy:
    """Accuracy of a model on a synthetic task."""

    num_examples: int  #: rows scored
    token_accuracy: float  #: fraction of answer tokens predicted exactly (greedy, teacher-forced)
    exact_match: float  #: fraction of rows whose every answer token is right
    answer_loss: float  #: mean cross-entropy (nats) on the answer tokens
    #: 1 for each row whose every answer token is right, else 0, in the order drawn (for a bootstrap)
    row_exact: tuple[int, ...] = ()
    #: each row's mean cross-entropy (nats) on its answer tokens, in the order drawn
    row_answer_loss: tuple[float, ...] = ()


@torch.no_grad()
def task_accuracy(
    model: nn.Module, task: Callable[[int, torch.Generator], Task], *, num_examples: int = 512,
    seed: int = 12345, batch_size: int = 64, position_offset: int = 0,
) -> TaskAccuracy:
    """Greedy, teacher-forced accuracy on ``num_examples`` fresh examples of ``task``.

    The examples come from their own generator (``seed``), so they differ from the training
    stream of :func:`train_task` (whose seed is ``cfg.seed``) except by chance. With
    ``position_offset`` the rows are read at positions ``offset, offset + 1, ...`` instead of
    ``0, 1, ...`` (the model must take ``positions``, as :class:`~posenc.lab.lm.TinyLM` does): the
    same rows, as far into a sequence as a longer one would put them.

    Raises:
        ValueError: if ``num_examples`` or ``batch_size`` is not a positive int.
    """
    for name, value in (("num_examples", num_examples), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(position_offset, int) or isinstance(position_offset, bool) or position_offset < 0:
        raise ValueError(f"position_offset must be an int >= 0, got {position_offset!r}")
    device = _device_of(model)
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    right = total = rows_right = 0
    loss_sum = 0.0
    row_exact: list[int] = []
    row_loss: list[float] = []
    try:
        for start in range(0, num_examples, batch_size):
            batch = task(min(batch_size, num_examples - start), generator)
            x, y, mask = (t.to(device) for t in (batch.inputs, batch.targets, batch.mask))
            if position_offset:
                logits = model(x, torch.arange(position_offset, position_offset + x.shape[1], device=device))
            else:
                logits = model(x)  # (B, T, V)
            hit = (logits.argmax(-1) == y) | ~mask  # (B, T), True off the answer
            right += int((hit & mask).sum())
            total += int(mask.sum())
            rows_right += int(hit.all(-1).sum())
            row_exact += hit.all(-1).int().tolist()
            token_loss = next_token_loss(logits, y, reduction="none")  # (B, T)
            loss_sum += float(token_loss[mask].sum())
            on_answer = torch.where(mask, token_loss, torch.zeros_like(token_loss)).double()
            row_loss += (on_answer.sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    finally:
        model.train(was_training)
    return TaskAccuracy(num_examples=num_examples, token_accuracy=right / total,
                        exact_match=rows_right / num_examples, answer_loss=loss_sum / total, row_exact=tuple(row_exact),
                        row_answer_loss=tuple(row_loss))
