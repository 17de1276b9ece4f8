"""TUPE: untied positional attention, a position-to-position logit term with its own projections.

Ke, He & Liu 2021, "Rethinking Positional Encoding in Language Pre-training", arXiv:2006.15595,
eqs. (10)-(11): absolute positions never touch the token embeddings; instead every layer adds

    α_ij = (x_i W^Q)(x_j W^K)ᵀ / sqrt(2D) + (p_i U^Q)(p_j U^K)ᵀ / sqrt(2D) [+ b_{j-i}]

where ``p`` is a learned absolute table shared by all heads, ``U^Q``, ``U^K`` differ per head and
are shared by all layers (so the positional term is computed once per forward pass), and the
optional ``b_{j-i}`` is T5's per-head relative bucket bias (TUPE-R; TUPE-A without it). The
paper's second change, untying the ``[CLS]`` token's position, concerns encoders with a
classification token and is not implemented.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.method import PositionMethod, register_method
from posenc.relative.common import check_positive_int, relative_positions
from posenc.relative.t5 import check_t5_bucket_args, t5_relative_bucket


def tupe_position_logits(p_q: Tensor, p_k: Tensor, u_q: Tensor, u_k: Tensor, num_heads: int) -> Tensor:
    """The untied position-to-position term ``(p_i U^Q)(p_j U^K)ᵀ / sqrt(2D)`` of every head.

    Args:
        p_q: ``(T, C)`` position embeddings of the queries.
        p_k: ``(S, C)`` position embeddings of the keys.
        u_q, u_k: ``(C, C)`` projections (the ``H`` per-head ``(C, D)`` blocks side by side).
        num_heads: ``H``.

    Returns:
        ``(H, T, S)``.

    Raises:
        ValueError: mismatched shapes.
    """
    C = p_q.shape[-1]
    if p_k.shape[-1] != C or u_q.shape != (C, C) or u_k.shape != (C, C) or C % num_heads:
        raise ValueError(
            f"need p_q (T, C), p_k (S, C), u_q and u_k (C, C) with H={num_heads} dividing C; "
            f"got {tuple(p_q.shape)}, {tuple(p_k.shape)}, {tuple(u_q.shape)}, {tuple(u_k.shape)}"
        )
    D = C // num_heads
    pq = (p_q @ u_q).view(-1, num_heads, D).transpose(0, 1)  # (H, T, D)
    pk = (p_k @ u_k).view(-1, num_heads, D).transpose(0, 1)  # (H, S, D)
    return pq @ pk.transpose(-2, -1) / math.sqrt(2 * D)  # (H, T, S)


class TUPE(PositionMethod):
    """TUPE-A (``relative=False``) or TUPE-R (``relative=True``) for the tiny LM.

    The content logit is rescaled from ``1/sqrt(D)`` to ``1/sqrt(2D)`` by dividing the queries by
    ``sqrt(2)``. The position term is the same in every layer (computed from shared parameters).

    Args:
        num_positions: rows of the absolute table ``p``; positions beyond raise an error.
        d_model: ``C``.
        num_heads: ``H``.
        relative: add T5's relative bucket bias (TUPE-R).
        num_buckets, max_distance, bidirectional: T5 bucket settings for TUPE-R.
        std: initial standard deviation.

    Parameters: ``p`` ``(N, C)``; ``u_q``, ``u_k`` ``(C, C)``; with ``relative``, ``b`` ``(num_buckets, H)``.
    """

    def __init__(self, num_positions: int, d_model: int, num_heads: int, *, relative: bool = False,
                 num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = False, std: float = 0.02):
        super().__init__()
        for name, value in (("num_positions", num_positions), ("d_model", d_model), ("num_heads", num_heads)):
            check_positive_int(value, name)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        self.max_positions, self.num_heads = num_positions, num_heads
        self.p = nn.Parameter(torch.randn(num_positions, d_model) * std)
        self.u_q = nn.Parameter(torch.randn(d_model, d_model) / math.sqrt(d_model))
        self.u_k = nn.Parameter(torch.randn(d_model, d_model) / math.sqrt(d_model))
        self.b = None
        if relative:
            check_t5_bucket_args(bidirectional, num_buckets, max_distance)
            self.bucket_args = (bidirectional, num_buckets, max_distance)
            self.b = nn.Parameter(torch.randn(num_buckets, num_heads) * std)

    def transform_qk(self, q, k, q_positions, k_positions, layer):
        return q / math.sqrt(2.0), k  # content logit q·k / sqrt(2D) under attention's 1/sqrt(D)

    def attention_bias(self, q, k, q_positions, k_positions, layer):
        self.check(q_positions, "q_positions")
        self.check(k_positions, "k_positions")
        dtype = q.dtype
        bias = tupe_position_logits(
            self.p[q_positions].to(dtype), self.p[k_positions].to(dtype), self.u_q.to(dtype), self.u_k.to(dtype),
            self.num_heads,
        )  # (H, T, S)
        if self.b is not None:
            buckets = t5_relative_bucket(relative_positions(q_positions, k_positions), *self.bucket_args)  # (T, S)
            bias = bias + self.b.to(dtype)[buckets].permute(2, 0, 1)  # (H, T, S)
        return bias.unsqueeze(0)  # (1, H, T, S)

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, num_heads={self.num_heads}, relative={self.b is not None}"


@register_method("tupe")
def _tupe(config) -> TUPE:
    return TUPE(config.max_len, config.d_model, config.n_head, relative=False)
