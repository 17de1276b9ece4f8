"""What training writes into a table of absolute position codes, measured per seed.

The learned-encoding chapter trains tables (plain, with a penalty, low-rank, hybrid, sinusoidal)
on windows shorter than the table and asks what the trained rows look like, how many directions
the model uses, what happens past the training length and whether training the unused rows
afterwards helps. :func:`measure_table_run` answers all of that for one trained model; as the
``measure`` of the stored ``"tables"`` study (:mod:`posenc.lab.experiments.compare`) it runs once per
seed, so every answer comes with its spread.

Shapes: ``N`` table rows, ``C`` model width, ``n`` the training length (rows ``0 .. n-1`` are the
ones training reached).
"""

from __future__ import annotations

import copy
import math
from typing import Optional

import torch
from torch import Tensor, nn

from posenc.absolute import LearnedPE, SinusoidalPE, extend_table, interpolate_table, sinusoidal_table
from posenc.lab.analysis import (best_rank_k, condition_number, cosine_matrix, effective_rank, neighbour_cosine,
                             numerical_rank, singular_values)
from posenc.lab.data import eval_windows
from posenc.lab.lm import next_token_loss
from posenc.lab.train import TrainConfig, evaluate, train

#: Ranks to which :func:`measure_table_run` truncates a trained learned table.
TRUNCATION_RANKS = (0, 1, 2, 4, 8, 16)
#: Fine-tuning of the rows past the training length (:func:`finetune_new_rows`), 60 steps on full-table windows.
FINETUNE = dict(steps=60, batch_size=8, warmup_steps=6, weight_decay=0.0, progress=False, seed=1)


def position_table(method: nn.Module, num_positions: int) -> Tensor:
    """``(num_positions, C)``: the codes an absolute table method adds at positions ``0 .. num_positions - 1``, detached.

    Raises:
        TypeError: if ``method`` has no ``table`` (it is not an absolute table method).
    """
    if not hasattr(method, "table"):
        raise TypeError(f"method must be an absolute table method with .table(), got {type(method).__name__}")
    if isinstance(method, SinusoidalPE):
        return method.table(num_positions).detach()
    return method.table()[:num_positions].detach()


def table_stats(table: Tensor, reference: Optional[Tensor] = None) -> dict:
    """Rank, spectrum, smoothness and likeness of a table ``(n, C)``.

    Keys: ``rank`` (numerical), ``eff99``/``eff90`` (directions holding 99% / 90% of the energy),
    ``s2`` (``sigma_2 / sigma_1``), ``kappa`` (condition number), ``smooth`` (:func:`~posenc.lab.analysis.neighbour_cosine`),
    ``trend`` (``|corr(u_1, t)|``, how much the dominant direction of the centred table is a linear
    trend in position), ``norm`` (Frobenius), ``min_distance`` (smallest distance between two codes
    over their mean norm), ``spectrum`` (``sigma_j / sigma_1``, 4 significant digits) and, with a
    ``reference`` table of the same shape, ``like_ref``: the correlation of the two tables' cosine
    matrices off the diagonal.
    """
    p = table.detach().double().cpu()  # (n, C)
    s = singular_values(p)
    n = p.shape[0]
    centred = p - p.mean(0)
    u1 = torch.linalg.svd(centred, full_matrices=False)[0][:, 0]  # (n,)
    t = torch.arange(n, dtype=torch.float64)
    off = ~torch.eye(n, dtype=torch.bool)
    distances = torch.cdist(p, p) + torch.diag(torch.full((n,), math.inf, dtype=torch.float64))
    out = dict(rank=numerical_rank(p.float()), eff99=effective_rank(p, 0.99), eff90=effective_rank(p, 0.9),
               s2=float(s[1] / s[0]), kappa=condition_number(p), smooth=neighbour_cosine(p),
               trend=abs(float(torch.corrcoef(torch.stack([u1, t]))[0, 1])), norm=float(p.norm()),
               min_distance=float(distances.min() / p.norm(dim=1).mean()),
               spectrum=[float(f"{x:.4g}") for x in (s / s[0]).tolist()])
    if reference is not None:
        pair = torch.stack([cosine_matrix(p)[off], cosine_matrix(reference.double().cpu())[off]])
        out["like_ref"] = float(torch.corrcoef(pair)[0, 1])
    return out


@torch.no_grad()
def context_control(model: nn.Module, data: Tensor, train_len: int, *, num_windows: int = 128,
                    batch_size: int = 16) -> dict[str, float]:
    """Separate unseen positions from a longer context, without training.

    The same bytes, the second halves (bytes ``n .. 2n-1``) of the ``2n``-byte evaluation windows,
    read five ways:

    * ``"seen"``: in windows of their own at positions ``0 .. n-1`` (nothing new);
    * ``"unseen"``: in windows of their own at positions ``n .. 2n-1`` (new positions, the usual context);
    * ``"long"``: inside the ``2n`` windows (new positions and a context twice as long);
    * ``"restart"``: inside the ``2n`` windows, at positions ``0 .. n-1`` and then ``0 .. n-1``
      again: the context twice as long at trained positions, each code given to two tokens ``n``
      apart (a pattern no training window holds, so not the long context alone);
    * ``"interpolated"`` (a :class:`~posenc.absolute.LearnedPE` model only): inside the ``2n``
      windows, with the table replaced by its trained rows ``0 .. n-1`` interpolated to ``2n``
      rows (:func:`~posenc.absolute.interpolate_table`): the long context, at positions made of
      trained rows only; ``"interpolated_first"`` is the loss of the first halves there (positions
      ``0 .. n-1``, whose codes the interpolation also changes).

    Returns:
        ``{"seen", "unseen", "long", "restart"[, "interpolated", "interpolated_first"]}``: losses in
        nats per token (the mean over windows of :func:`context_windows`).
    """
    return {name: float(losses.mean())
            for name, losses in context_windows(model, data, train_len, num_windows=num_windows,
                                                batch_size=batch_size).items()}


@torch.no_grad()
def context_windows(model: nn.Module, data: Tensor, train_len: int, *, num_windows: int = 128,
                    batch_size: int = 16) -> dict[str, Tensor]:
    """:func:`context_control`'s readings window by window: ``{name: (num_windows,)}``, the mean
    loss of each window's scored half (float64), the items an evaluation-sample interval resamples."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n = train_len
    x_long, y_long = eval_windows(data, 2 * n, num_windows)  # (W, 2n)
    x_half, y_half = x_long[:, n:], y_long[:, n:]  # (W, n)

    def token_losses(x: Tensor, y: Tensor, positions: Optional[Tensor] = None) -> Tensor:  # (W, T)
        return torch.cat([next_token_loss(model(x[i:i + batch_size].to(device), positions=positions),
                                          y[i:i + batch_size].to(device), reduction="none").double().cpu()
                          for i in range(0, num_windows, batch_size)])

    try:
        out = {name: token_losses(x_half, y_half, torch.arange(start, start + n, device=device)).mean(1)
               for name, start in (("seen", 0), ("unseen", n))}
        out["long"] = token_losses(x_long, y_long)[:, n:].mean(1)
        out["restart"] = token_losses(x_long, y_long, torch.arange(2 * n, device=device) % n)[:, n:].mean(1)
        if isinstance(model.position, LearnedPE):
            squeezed = interpolate_table(model.position.weight[:n].detach(), 2 * n)  # (2n, C)
            halves = _eval_with_rows(model, data, slice(0, 2 * n), squeezed, 2 * n, num_windows,
                                     bands=(n,)).loss_per_window_band.double()  # (W, 2)
            out["interpolated"], out["interpolated_first"] = halves[:, 1], halves[:, 0]
    finally:
        model.train(was_training)
    return out


def finetune_new_rows(model: nn.Module, train_data: Tensor, val_data: Tensor, train_len: int, *, init: str = "as trained",
                      cfg: Optional[TrainConfig] = None, num_windows: int = 128) -> tuple[float, float]:
    """Train only the rows past ``train_len`` of a copy of ``model``'s :class:`~posenc.absolute.LearnedPE` table.

    Every other parameter, and rows ``0 .. train_len - 1``, stay frozen (a gradient hook zeroes
    those rows' gradient; weight decay is off). ``init="copy"`` first fills the new rows with
    copies of the trained ones (:func:`~posenc.absolute.extend_table`), ``"as trained"`` keeps them.

    Returns:
        ``(before, after)``: the mean loss at positions ``train_len .. N-1`` of ``N``-token windows
        of ``val_data``, before and after training on ``train_data``. ``model`` itself is not changed.

    Raises:
        ValueError: if ``init`` is not ``"as trained"`` or ``"copy"``.
        TypeError: if the model's position method is not a ``LearnedPE``.
    """
    if init not in ("as trained", "copy"):
        raise ValueError(f"init must be 'as trained' or 'copy', got {init!r}")
    if not isinstance(model.position, LearnedPE):
        raise TypeError(f"model.position must be a LearnedPE, got {type(model.position).__name__}")
    model = copy.deepcopy(model)
    weight = model.position.weight  # (N, C)
    n_table = weight.shape[0]
    cfg = cfg or TrainConfig(seq_len=n_table, **FINETUNE)
    if init == "copy":
        with torch.no_grad():
            weight.copy_(extend_table(weight[:train_len], n_table, init="copy"))

    def new_positions_loss() -> float:
        lpp = evaluate(model, val_data, n_table, num_windows=num_windows).loss_per_position
        return float(lpp[train_len:].mean())

    before = new_positions_loss()
    for name, p in model.named_parameters():
        p.requires_grad_(name == "position.weight")
    new_rows = torch.zeros(n_table, 1, device=weight.device)
    new_rows[train_len:] = 1.0
    hook = weight.register_hook(lambda g: g * new_rows)
    try:
        train(model, train_data, cfg)
    finally:
        hook.remove()
    return before, new_positions_loss()


@torch.no_grad()
def _eval_with_rows(model: nn.Module, data: Tensor, rows: slice, values: Tensor, seq_len: int,
                    num_windows: int, bands: tuple[int, ...] = ()):
    """:func:`~posenc.lab.train.evaluate` with ``weight[rows]`` replaced by ``values``, then restored."""
    weight = model.position.weight
    kept = weight.detach().clone()
    weight[rows] = values.to(weight)
    try:
        return evaluate(model, data, seq_len, num_windows=num_windows, bands=bands)
    finally:
        weight.copy_(kept)


def _loss_with_rows(model: nn.Module, data: Tensor, rows: slice, values: Tensor, seq_len: int,
                    num_windows: int, part: slice) -> float:
    """Loss (mean over ``part`` of the positions) with ``weight[rows]`` replaced by ``values``, then restored."""
    return float(_eval_with_rows(model, data, rows, values, seq_len, num_windows).loss_per_position[part].mean())


def measure_table_run(model: nn.Module, run) -> dict:
    """Everything the learned-encoding chapter asks of one trained model (the ``"tables"`` study's ``measure``).

    On the copy task, only ``table``: :func:`table_stats` of the whole (trained) table. In the LM,
    for every arm: ``penalty_at_start`` (the penalty's value at step 0, 0 without one); ``inside``
    and ``outside``, the mean loss at positions ``0 .. n-1`` and ``n .. N-1`` of ``N``-token
    windows (128 of them); ``control`` (:func:`context_control`); ``per_window`` (``inside``,
    ``outside`` and each reading of ``control``, window by window: :func:`context_windows`, 6
    significant digits); ``trained_rows`` and
    ``untrained_rows`` (:func:`table_stats` of rows ``0 .. n-1`` against the sinusoidal table, and
    the smoothness and relative norm of the others). For the plain, registered :class:`~posenc.absolute.LearnedPE`
    (no penalty, no custom builder), also: ``decay`` (the product of ``1 - m * lr_t * weight_decay``, ``m`` the
    run's :attr:`~posenc.lab.experiments.compare.TrainedRun.position_lr_mult`: AdamW's decoupled decay of the table at
    the table's own learning rate), ``untrained_change`` (largest
    ``|P - decay * P_init|`` over rows ``n ..``), ``delta_rows`` (stats of ``P - decay * P_init``),
    ``rank_truncation`` (loss change at the training length when rows ``0 .. n-1`` are replaced by
    their best rank-``k`` approximation), ``replaced_rows`` (``outside`` with rows ``n ..`` set to
    zero or to row ``n-1``), ``finetune`` (:func:`finetune_new_rows` from both starts) and
    ``bf16_delta`` (loss change at the training length when the table is rounded to bfloat16).
    """
    study, history, corpus = run.study, run.history, run.corpus
    if run.setting != "lm":                        # the copy task: every row is trained; the table's shape only
        table = position_table(model.position, model.config.max_len).cpu()  # (2 * copy_length, C)
        return {"table": table_stats(table, sinusoidal_table(*table.shape))}
    n, n_table = study.lm.seq_len, study.model.max_len
    out: dict = {"penalty_at_start": history.penalties[0]}
    full = evaluate(model, corpus.val, n_table, num_windows=128, bands=(n,))
    out["inside"], out["outside"] = (float(full.loss_per_position[:n].mean()),
                                     float(full.loss_per_position[n:].mean()))
    windows = context_windows(model, corpus.val, n)  # {reading: (128,)}
    out["control"] = {name: float(losses.mean()) for name, losses in windows.items()}
    # each window's loss in every reading, for the evaluation-sample uncertainty of their differences
    band = full.loss_per_window_band.double()  # (128, 2)
    out["per_window"] = {name: [float(f"{x:.6g}") for x in losses.tolist()] for name, losses in
                         (("inside", band[:, 0]), ("outside", band[:, 1]), *windows.items())}
    table = position_table(model.position, n_table).cpu()  # (N, C)
    reference = sinusoidal_table(n, table.shape[1])
    out["trained_rows"] = table_stats(table[:n], reference)
    out["untrained_rows"] = dict(smooth=neighbour_cosine(table[n:]),
                                 norm_ratio=float(table[n:].norm() / table[:n].norm()))
    if type(model.position) is LearnedPE and run.arm.penalty is None and run.arm.build is None:
        weight = model.position.weight
        # AdamW decays the table at its own learning rate, the base rate times the run's multiplier
        decay = math.prod(1 - lr * run.position_lr_mult * study.lm.weight_decay for lr in history.lrs)
        initial = run.initial_position["weight"].to(weight)
        out["decay"] = decay
        out["untrained_change"] = float((weight[n:].detach() - decay * initial[n:]).abs().max())
        out["delta_rows"] = table_stats(weight[:n].double() - decay * initial[:n].double(), reference)
        at_train = float(evaluate(model, corpus.val, n, num_windows=study.eval_windows).loss_per_position.mean())
        out["rank_truncation"] = {
            str(k): _loss_with_rows(model, corpus.val, slice(0, n), best_rank_k(weight[:n].detach(), k)[0], n,
                                    study.eval_windows, slice(None)) - at_train
            for k in TRUNCATION_RANKS}
        out["replaced_rows"] = {
            name: _loss_with_rows(model, corpus.val, slice(n, None), rows, n_table, 128, slice(n, None))
            for name, rows in (("zeros", torch.zeros_like(weight[n:])),
                               ("last trained row", weight[n - 1].detach().expand(n_table - n, -1)))}
        out["finetune"] = {init: list(finetune_new_rows(model, corpus.train, corpus.val, n, init=init))
                           for init in ("as trained", "copy")}
        out["bf16_delta"] = _loss_with_rows(model, corpus.val, slice(None), weight.detach().bfloat16().float(), n,
                                            study.eval_windows, slice(None)) - at_train
    return out
