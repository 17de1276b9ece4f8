"""What every relative method shares: relative positions, the four-term expansion, the relative shift,
and a base class for scalar biases that depend only on (head, relative position).

Relative position is ``key_position - query_position`` everywhere in this package: negative for
keys in the past, ``0`` on the diagonal. Papers that write ``i - j`` (query minus key:
Transformer-XL, DeBERTa) are converted at the boundary and say so.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.method import PositionMethod, check_positions


def relative_positions(q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """Matrix of relative positions ``key_position - query_position``.

    Args:
        q_positions: ``(T,)`` integer query positions, or per batch row ``(B, T)``.
        k_positions: ``(S,)`` integer key positions, or per batch row ``(B, S)``.

    Returns:
        ``(T, S)`` int64, entry ``[t, s] = k_positions[s] - q_positions[t]``; ``(B, T, S)`` where a
        position tensor has a batch dim.

    Raises:
        TypeError: if a position tensor is not an integer tensor.
        ValueError: if a position tensor is not 1-D or 2-D or has a negative entry.
    """
    check_positions(q_positions, "q_positions", per_row=True)
    check_positions(k_positions, "k_positions", per_row=True)
    return k_positions.long().unsqueeze(-2) - q_positions.long().unsqueeze(-1)  # (T, S) or (B, T, S)


def check_int_tensor(x, name: str) -> None:
    """Raise ``TypeError`` unless ``x`` is an integer (not bool) tensor."""
    if not isinstance(x, Tensor) or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {getattr(x, 'dtype', type(x).__name__)}")


def check_positive_int(value, name: str, minimum: int = 1) -> None:
    """Raise ``ValueError`` unless ``value`` is an int ``>= minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def four_terms(x: Tensor, p: Tensor, w_q: Tensor, w_k: Tensor) -> dict[str, Tensor]:
    """The four terms of the logit ``(x_i + p_i) W_Q ((x_j + p_j) W_K)ᵀ`` of absolute encodings.

    Expanding the product (Ke et al. 2021, arXiv:2006.15595, eq. 3; Dai et al. 2019, arXiv:1901.02860,
    §3.3, terms (a)-(d)) gives
    ``content-content + content-position + position-content + position-position``; relative
    methods keep, replace or drop individual terms. The four terms sum to the full logit.

    Args:
        x: ``(T, C)`` token (content) embeddings.
        p: ``(T, C)`` position embeddings.
        w_q: ``(C, D)`` query projection.
        w_k: ``(C, D)`` key projection.

    Returns:
        dict with keys ``"content-content"`` ``x W_Q (x W_K)ᵀ``, ``"content-position"``
        ``x W_Q (p W_K)ᵀ``, ``"position-content"`` ``p W_Q (x W_K)ᵀ`` and
        ``"position-position"`` ``p W_Q (p W_K)ᵀ``, each ``(T, T)`` (unscaled).

    Raises:
        ValueError: if the shapes do not chain.
    """
    if x.dim() != 2 or x.shape != p.shape:
        raise ValueError(f"x and p must both have shape (T, C), got {tuple(x.shape)} and {tuple(p.shape)}")
    if w_q.dim() != 2 or w_q.shape != w_k.shape or w_q.shape[0] != x.shape[1]:
        raise ValueError(f"w_q and w_k must both have shape (C, D) with C={x.shape[1]}, got {tuple(w_q.shape)} and {tuple(w_k.shape)}")
    qx, kx, qp, kp = x @ w_q, x @ w_k, p @ w_q, p @ w_k  # (T, D) each
    return {
        "content-content": qx @ kx.T,
        "content-position": qx @ kp.T,
        "position-content": qp @ kx.T,
        "position-position": qp @ kp.T,
    }


def relative_shift(x: Tensor, s: int) -> Tensor:
    """Turn scores against every relative position into scores against every key (the "relative shift").

    Transformer-XL (Dai et al. 2019, arXiv:1901.02860, appendix B) computes ``q_t · r`` for all
    ``T + S - 1`` relative positions with one matmul and then re-indexes the result so that entry
    ``[t, s]`` holds the score for the relative position of query ``t`` and key ``s``. Queries are
    the last ``T`` of ``S`` keys (as with a cache): query ``t`` sits at key index ``t + S - T``.
    Column ``m`` of ``x`` holds relative position ``m - (S - 1)`` (key minus query, ascending
    from ``-(S-1)`` to ``T-1``). The re-indexing is a pad and two reshapes of the same memory:
    ``out[t, s] = x[t, s + T - 1 - t]``, exact for every ``(t, s)`` (the original code's variant
    leaves wrapped values above the causal diagonal, which its mask hides).

    Args:
        x: ``(..., T, T + S - 1)`` scores against relative positions ``-(S-1) .. T-1``.
        s: number of keys ``S``.

    Returns:
        ``(..., T, S)``.

    Raises:
        ValueError: if the last dimension is not ``T + S - 1``.
    """
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., T, T + S - 1), got {tuple(x.shape)}")
    *lead, t, w = x.shape
    if not isinstance(s, int) or s < t or w != t + s - 1:
        raise ValueError(f"x of shape {tuple(x.shape)} needs s = {w - t + 1} keys (last dim = T + S - 1, S >= T), got s={s!r}")
    flat = F.pad(x, (0, 1)).reshape(*lead, t * (w + 1))  # rows of length T + S
    return flat[..., t - 1 : t - 1 + t * w].reshape(*lead, t, w)[..., :s]  # (..., T, S)


class RelativeScalarBias(PositionMethod):
    """Base of methods whose logit bias is ``f(head, key_position - query_position)``, per layer.

    Subclasses implement :meth:`relative_bias`. This class turns it into the materialised
    ``(1, H, T, S)`` bias and into a bias function for the flex backend, both read from the same
    lookup table over the relative positions present, so the two forms agree exactly. The table
    has ``T + S - 1`` entries per head for contiguous positions: no ``T x S`` tensor.
    """

    def relative_bias(self, relative: Tensor, layer: int) -> Tensor:
        """Bias of every head for each relative position.

        Args:
            relative: ``(N,)`` int64 relative positions (key minus query).
            layer: attention layer index.

        Returns:
            ``(H, N)`` float bias.
        """
        raise NotImplementedError

    per_row_positions = True

    def _lookup(self, q_positions: Tensor, k_positions: Tensor, layer: int) -> tuple[Tensor, int]:
        check_positions(q_positions, "q_positions", per_row=True)
        check_positions(k_positions, "k_positions", per_row=True)
        lo = int(k_positions.min()) - int(q_positions.max())
        hi = int(k_positions.max()) - int(q_positions.min())
        relative = torch.arange(lo, hi + 1, device=q_positions.device)  # (N,), N = T + S - 1 if contiguous
        return self.relative_bias(relative, layer), lo  # (H, N)

    def attention_bias(self, q, k, q_positions, k_positions, layer) -> Tensor:
        table, lo = self._lookup(q_positions, k_positions, layer)  # (H, N)
        index = relative_positions(q_positions, k_positions) - lo  # (T, S) or (B, T, S)
        bias = table[:, index]  # (H, T, S) or (H, B, T, S)
        return (bias.unsqueeze(0) if index.dim() == 2 else bias.transpose(0, 1)).to(q.dtype)  # (1 or B, H, T, S)

    def attention_bias_fn(self, q, k, q_positions, k_positions, layer) -> Optional[Callable]:
        table, lo = self._lookup(q_positions, k_positions, layer)  # (H, N)
        table = table.to(q.dtype)
        qp, kp = q_positions.long(), k_positions.long()
        q_of = (lambda b, i: qp[b, i]) if qp.dim() == 2 else (lambda b, i: qp[i])  # noqa: E731
        k_of = (lambda b, i: kp[b, i]) if kp.dim() == 2 else (lambda b, i: kp[i])  # noqa: E731

        def bias_fn(b, h, q_idx, kv_idx):
            return table[h, k_of(b, kv_idx) - q_of(b, q_idx) - lo]

        return bias_fn
