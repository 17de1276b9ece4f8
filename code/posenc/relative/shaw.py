"""Shaw et al. 2018: learned vectors for clipped relative positions, added to keys and to values.

Self-Attention with Relative Position Representations, arXiv:1803.02155, eqs. (3)-(6):

    e_ij = q_i · (k_j + a^K_ij) / sqrt(D),      z_i = sum_j alpha_ij (v_j + a^V_ij),
    a^K_ij = w^K[clip(j - i, -k, k)],          a^V_ij = w^V[clip(j - i, -k, k)],

with ``j - i`` = key minus query (the paper's own convention) and ``2k + 1`` learned vectors per
table, shared by all heads of a layer. The efficient forms below never build the
``(B, H, T, S, D)`` tensor of ``a_ij``: the key term is ``q Wᵀ`` against the ``2k + 1`` table rows,
then a gather; the value term sums the weights of each relative id, then multiplies by the table.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.method import PositionMethod, register_method
from posenc.relative.common import check_int_tensor, check_positive_int, relative_positions


def shaw_relative_ids(relative_position: Tensor, max_distance: int) -> Tensor:
    """Row of Shaw's tables for each relative position: ``clip(r, -k, k) + k``.

    Args:
        relative_position: integer tensor of any shape, ``key_position - query_position``.
        max_distance: clipping distance ``k >= 1``.

    Returns:
        int64 ids in ``0 .. 2k``, same shape (``k`` is "same position").

    Raises:
        TypeError: non-integer ``relative_position``.
        ValueError: ``max_distance`` not a positive int.
    """
    check_int_tensor(relative_position, "relative_position")
    check_positive_int(max_distance, "max_distance")
    return relative_position.long().clamp(-max_distance, max_distance) + max_distance


def _check_table(table: Tensor, name: str, d: int) -> None:
    if not isinstance(table, Tensor) or table.dim() != 2 or table.shape[1] != d or table.shape[0] % 2 != 1:
        raise ValueError(f"{name} must have shape (2k + 1, D) with D={d}, got {tuple(getattr(table, 'shape', ()))}")


def shaw_key_bias(q: Tensor, table_k: Tensor, ids: Tensor) -> Tensor:
    """Shaw's key term ``q_i · a^K_ij / sqrt(D)`` for every query and key, as a logit bias.

    Computed as ``(q @ table_kᵀ)`` of shape ``(B, H, T, 2k+1)``, then gathered at ``ids``: the cost
    is ``O(B H T k D + B H T S)`` instead of the ``O(B H T S D)`` of forming every ``a^K_ij``.

    Args:
        q: ``(B, H, T, D)`` queries.
        table_k: ``(2k + 1, D)`` relative key vectors ``w^K``.
        ids: ``(T, S)`` row of the table for each (query, key), from :func:`shaw_relative_ids`.

    Returns:
        ``(B, H, T, S)`` bias, in the dtype of ``q``.

    Raises:
        ValueError: mismatched shapes.
    """
    D = q.shape[-1]
    _check_table(table_k, "table_k", D)
    if ids.dim() != 2 or ids.shape[0] != q.shape[-2]:
        raise ValueError(f"ids must have shape (T, S) with T={q.shape[-2]}, got {tuple(ids.shape)}")
    scores = (q @ table_k.to(q.dtype).T) * D**-0.5  # (B, H, T, 2k+1)
    index = ids.expand(*q.shape[:-2], *ids.shape)  # (B, H, T, S)
    return torch.gather(scores, -1, index)  # (B, H, T, S)


def shaw_value_term(weights: Tensor, table_v: Tensor, ids: Tensor) -> Tensor:
    """Shaw's value term ``sum_j alpha_ij a^V_ij`` for every query.

    Adds up the attention weight each query puts on each relative id (``2k + 1`` sums, a
    scatter-add), then multiplies by the table: ``O(B H T S + B H T k D)``.

    Args:
        weights: ``(B, H, T, S)`` attention weights ``alpha``.
        table_v: ``(2k + 1, Dv)`` relative value vectors ``w^V``.
        ids: ``(T, S)`` table rows, from :func:`shaw_relative_ids`.

    Returns:
        ``(B, H, T, Dv)`` in the dtype of ``weights``.

    Raises:
        ValueError: mismatched shapes.
    """
    if weights.dim() != 4 or ids.shape != weights.shape[-2:]:
        raise ValueError(f"weights (B, H, T, S) and ids (T, S) disagree: {tuple(weights.shape)} vs {tuple(ids.shape)}")
    if not isinstance(table_v, Tensor) or table_v.dim() != 2 or table_v.shape[0] % 2 != 1:
        raise ValueError(f"table_v must have shape (2k + 1, Dv), got {tuple(getattr(table_v, 'shape', ()))}")
    per_id = weights.new_zeros(*weights.shape[:-1], table_v.shape[0])  # (B, H, T, 2k+1)
    per_id.scatter_add_(-1, ids.expand_as(weights), weights)
    return per_id @ table_v.to(weights.dtype)  # (B, H, T, Dv)


class ShawRelativePE(PositionMethod):
    """Shaw et al.'s relative position representations, one key and one value table per layer.

    Both tables are shared by the heads of a layer (as in the paper). The key term is a logit
    bias (``attention_bias``; on the flex backend, ``attention_bias_fn`` reads the ``(B, H, T, 2k+1)``
    scores, so nothing of size ``T x S`` is built). The value term needs the attention weights,
    so with ``value=True`` attention runs on the reference backend.

    Args:
        head_dim: ``D``.
        max_distance: clipping distance ``k`` (the paper uses 16, and found no gain beyond 2).
        num_layers: number of attention layers.
        key, value: include the key term and the value term.
        std: initial standard deviation of the tables.

    Parameters: ``table_k``, ``table_v`` ``(L, 2k + 1, D)`` (only those enabled).
    """

    def __init__(self, head_dim: int, max_distance: int = 16, *, num_layers: int = 1,
                 key: bool = True, value: bool = True, std: float = 0.02):
        super().__init__()
        check_positive_int(head_dim, "head_dim")
        check_positive_int(max_distance, "max_distance")
        check_positive_int(num_layers, "num_layers")
        if not (key or value):
            raise ValueError("ShawRelativePE needs key=True or value=True (or both)")
        self.max_distance, self.head_dim = max_distance, head_dim
        shape = (num_layers, 2 * max_distance + 1, head_dim)
        self.table_k = nn.Parameter(torch.randn(shape) * std) if key else None
        self.table_v = nn.Parameter(torch.randn(shape) * std) if value else None
        self.needs_attention_weights = value

    def ids(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``(T, S)`` table rows for the given positions."""
        return shaw_relative_ids(relative_positions(q_positions, k_positions), self.max_distance)

    def attention_bias(self, q, k, q_positions, k_positions, layer):
        if self.table_k is None:
            return None
        return shaw_key_bias(q, self.table_k[layer], self.ids(q_positions, k_positions))  # (B, H, T, S)

    def attention_bias_fn(self, q, k, q_positions, k_positions, layer):
        if self.table_k is None:
            return None
        D, m = q.shape[-1], self.max_distance
        scores = (q @ self.table_k[layer].to(q.dtype).T) * D**-0.5  # (B, H, T, 2k+1)
        qp, kp = q_positions.long(), k_positions.long()

        def bias_fn(b, h, q_idx, kv_idx):
            return scores[b, h, q_idx, torch.clamp(kp[kv_idx] - qp[q_idx], -m, m) + m]

        return bias_fn

    def value_term(self, weights, q_positions, k_positions, layer):
        return shaw_value_term(weights, self.table_v[layer], self.ids(q_positions, k_positions))

    def extra_repr(self) -> str:
        return f"max_distance={self.max_distance}, key={self.table_k is not None}, value={self.table_v is not None}"


@register_method("shaw")
def _shaw(config) -> ShawRelativePE:
    return ShawRelativePE(config.d_model // config.n_head, max_distance=16, num_layers=config.n_layer)
