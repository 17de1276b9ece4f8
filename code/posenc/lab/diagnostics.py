"""Diagnosing length extrapolation from attention weights: entropy and attention by distance.

A model trained on windows of ``L`` tokens and run on ``n > L`` meets two new things: distances
(and, for absolute codes, positions) it never saw, and more keys per query. The loss at every
position (:func:`posenc.lab.train.evaluate`) shows *where* a model fails; the two functions here show
*how* its attention changes:

- :func:`attention_entropy`: the entropy of each query's attention distribution. A query that
  spreads its weight evenly over ``m`` keys has entropy ``log m``; if the entropy keeps growing
  with the length, attention is diluting over keys the model never had to ignore in training
  (what log-n scaling, :func:`posenc.attention.logn_query_scale`, counteracts);
- :func:`attention_by_distance`: each query's weights re-indexed by distance ``i - j`` from the
  query (the negative of the relative position ``j - i``, key minus query, of the package's
  convention), so attention beyond the training distance can be read off directly.

Both take the ``(B, H, T, S)`` weights that :class:`posenc.lab.lm.TinyLM` returns with
``return_weights=True`` (rows sum to 1; causal, with query ``t`` at position ``S - T + t``), compute
in float64 and return float64 tensors on the weights' device.

Before the softmax, :func:`capture_qk` records the queries and keys a position method hands to
attention (for RoPE, after the rotation), and :func:`score_by_distance` averages their scores over
the pairs at each distance: the quantity whose decay RoFormer's bound is about (chapter 6).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional

import torch
from torch import Tensor

from posenc.method import PositionMethod


def _check_weights(weights: Tensor) -> None:
    if not isinstance(weights, Tensor) or not weights.dtype.is_floating_point:
        got = weights.dtype if isinstance(weights, Tensor) else type(weights).__name__
        raise TypeError(f"weights must be a floating-point tensor of attention weights, got {got}")
    if weights.dim() < 2 or weights.shape[-1] < weights.shape[-2] or weights.shape[-1] == 0:
        raise ValueError(f"weights must have shape (..., T, S) with 1 <= T <= S, got {tuple(weights.shape)}")


def attention_entropy(weights: Tensor) -> Tensor:
    """Entropy (nats) of every query's attention distribution, ``-sum_j w_ij log w_ij``.

    Zero weights (masked keys) contribute 0. A uniform distribution over ``m`` keys has entropy
    ``log m``; one key, 0.

    Args:
        weights: ``(..., T, S)`` attention weights, each row a distribution over the ``S`` keys.

    Returns:
        ``(..., T)`` float64 entropies.

    Raises:
        TypeError: if ``weights`` is not a floating-point tensor.
        ValueError: if it is not ``(..., T, S)`` with ``1 <= T <= S``.
    """
    _check_weights(weights)
    w = weights.double()
    return -torch.special.xlogy(w, w).sum(-1)  # (..., T)


def attention_by_distance(weights: Tensor) -> Tensor:
    """Causal attention weights re-indexed by the distance ``d = i - j`` from query ``i`` to key ``j``.

    Query ``t`` of ``T`` is taken to sit at position ``i = S - T + t`` (the last ``T`` of ``S``
    keys, as with a KV cache or ``T == S``). ``out[..., t, d]`` is the weight query ``t`` puts on
    the key ``d`` positions back (relative position ``-d``), and 0 where ``d > i``.

    Args:
        weights: ``(..., T, S)`` causal attention weights (weights on keys after the query must be 0).

    Returns:
        ``(..., T, S)`` float64; column ``d`` is distance ``d``, so each row still sums to the row
        of ``weights``.

    Raises:
        TypeError: if ``weights`` is not a floating-point tensor.
        ValueError: if it is not ``(..., T, S)`` with ``1 <= T <= S``, or puts weight on a key after
            its query (not causal).
    """
    _check_weights(weights)
    T, S = weights.shape[-2:]
    i = torch.arange(S - T, S, device=weights.device)[:, None]  # (T, 1) query positions
    d = torch.arange(S, device=weights.device)[None, :]  # (1, S) distances
    j = i - d  # (T, S) the key at distance d
    future = torch.arange(S, device=weights.device)[None, :] > i  # (T, S) keys after the query
    if bool((weights[..., future] != 0).any()):
        raise ValueError("weights must be causal (zero on keys after the query); attention_by_distance "
                         "reads causal weights, got weight on a later key")
    index = j.clamp(min=0).expand(*weights.shape[:-2], T, S)  # (..., T, S)
    out = torch.gather(weights.double(), -1, index)  # (..., T, S)
    return out.masked_fill(j < 0, 0.0)


@contextlib.contextmanager
def capture_qk(method: PositionMethod) -> Iterator[list]:
    """Record what ``method.transform_qk`` returns while the block runs.

    Inside ``with capture_qk(model.position) as qk:``, every call of the method's ``transform_qk``
    (one per attention layer and forward pass) appends ``(layer, q, k)``, detached: the queries and
    keys that attention scores, after the method's transform (for RoPE, rotated). The method is
    restored on exit, also after an exception, and captures may be nested.

    Yields:
        The list of ``(layer, q (B, H, T, D), k (B, H, S, D))`` records, filled as the model runs.

    Raises:
        TypeError: if ``method`` is not a :class:`~posenc.method.PositionMethod`.
    """
    if not isinstance(method, PositionMethod):
        raise TypeError(f"method must be a PositionMethod, got {type(method).__name__}")
    records: list = []
    original = method.transform_qk
    shadowed = vars(method).get("transform_qk")  # an enclosing capture's recorder, if any

    def recording(q, k, q_positions, k_positions, layer):
        q, k = original(q, k, q_positions, k_positions, layer)
        records.append((layer, q.detach(), k.detach()))
        return q, k

    method.transform_qk = recording  # an instance attribute, shadowing the class's method
    try:
        yield records
    finally:
        if shadowed is None:
            del method.transform_qk
        else:
            method.transform_qk = shadowed


def score_by_distance(q: Tensor, k: Tensor, scale: Optional[float] = None) -> Tensor:
    """Mean attention score ``scale * q_i . k_j`` over the query-key pairs at each distance ``d = i - j``.

    Queries and keys of one causal self-attention over ``T`` tokens (query ``i`` and key ``j`` at
    positions ``i`` and ``j``); distance ``d`` has ``T - d`` pairs per sequence, which are averaged,
    so long distances are seen only by late queries. Leading dimensions (batch, heads) are kept.

    Args:
        q: ``(..., T, D)`` queries, after any position transform.
        k: ``(..., T, D)`` keys, same shape.
        scale: multiplies the dot product (default ``1 / sqrt(D)``, as attention does).

    Returns:
        ``(..., T)`` float64 on the inputs' device: entry ``d`` is the mean score at distance ``d``
        for each leading index (average over the batch yourself, e.g. ``.mean(0)``).

    Raises:
        TypeError: if ``q`` or ``k`` is not a floating-point tensor.
        ValueError: if their shapes differ or are not ``(..., T, D)`` with ``T, D >= 1``.
    """
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"{name} must be a floating-point tensor, got {got}")
    if q.shape != k.shape or q.dim() < 2 or 0 in q.shape[-2:]:
        raise ValueError(f"q and k must both have shape (..., T, D) with T, D >= 1, got {tuple(q.shape)} and {tuple(k.shape)}")
    T, D = q.shape[-2:]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale  # (..., T, T)
    i = torch.arange(T, device=q.device)[:, None]  # (T, 1)
    j = i - torch.arange(T, device=q.device)[None, :]  # (T, T): the key at distance d from query i
    by_d = torch.gather(scores, -1, j.clamp(min=0).expand_as(scores)).masked_fill(j < 0, 0.0)  # (..., T, T)
    count = torch.arange(T, 0, -1, device=q.device, dtype=torch.float64)  # T - d pairs at distance d
    return by_d.sum(-2) / count  # (..., T)
