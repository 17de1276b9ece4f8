"""Transformer-XL's relative attention: four terms, two learned global biases u and v, sinusoidal R.

Dai et al. 2019, arXiv:1901.02860, §3.3, the logit of query i and key j:

    A_ij = q_i·k_j  +  q_i·W_{k,R} R_{i-j}  +  u·k_j  +  v·W_{k,R} R_{i-j}
           (a) content  (b) content-position  (c) global content  (d) global position

with ``q_i = W_q x_i``, ``k_j = W_{k,E} x_j``, ``R`` the sinusoid table of the *query minus key*
distance ``i - j`` (the paper's convention; this module converts from ``key - query``), a
projection ``W_{k,R}`` of its own, and ``u``, ``v`` ``(H, D)`` shared by all positions. Terms
(b) + (d) are computed together as ``(q_i + v) · W_{k,R} R`` against every relative position at
once, then re-indexed with :func:`~posenc.relative.common.relative_shift`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.absolute import inverse_frequencies
from posenc.method import PositionMethod, register_method
from posenc.relative.common import check_int_tensor, check_positive_int, relative_positions, relative_shift


def transformer_xl_sinusoids(distance: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Transformer-XL's ``R_δ = [sin(δ ω), cos(δ ω)]`` for signed integer distances ``δ`` (query minus key).

    Frequencies ``ω_i = base ** (-2i / dim)`` as in Vaswani et al.; the sines fill the first half
    of the vector and the cosines the second (``layout="half"``), as in the paper's code.

    Args:
        distance: ``(N,)`` integer distances, any sign.
        dim: ``C``, even.
        base: frequency base.

    Returns:
        ``(N, C)`` float64 on the device of ``distance``.

    Raises:
        TypeError: non-integer ``distance``.
        ValueError: ``distance`` not 1-D, bad ``dim`` or ``base``.
    """
    check_int_tensor(distance, "distance")
    if distance.dim() != 1:
        raise ValueError(f"distance must be 1-D (N,), got shape {tuple(distance.shape)}")
    angles = distance.double()[:, None] * inverse_frequencies(dim, base).to(distance.device)  # (N, C/2)
    return torch.cat([angles.sin(), angles.cos()], dim=1)  # (N, C)


def _is_shiftable(q_positions: Tensor, k_positions: Tensor) -> bool:
    """True if keys are consecutive and the queries are the last T of them (the layout the shift assumes)."""
    T, S = q_positions.numel(), k_positions.numel()
    if S == 0 or T > S:
        return False
    consecutive = torch.arange(S, device=k_positions.device) + k_positions[0]
    return bool(torch.equal(k_positions, consecutive) and torch.equal(q_positions, k_positions[S - T :]))


def transformer_xl_bias(
    q: Tensor, k: Tensor, r: Tensor, u: Tensor, v: Tensor, q_positions: Tensor, k_positions: Tensor
) -> Tensor:
    """Terms (b) + (c) + (d) of Transformer-XL's logit, scaled by ``1/sqrt(D)`` like term (a).

    Args:
        q: ``(B, H, T, D)`` queries ``W_q x_i``.
        k: ``(B, H, S, D)`` keys ``W_{k,E} x_j``.
        r: ``(H, N, D)`` projected relative sinusoids ``W_{k,R} R`` for the ``N`` relative positions
            ``key - query = lo .. lo + N - 1``, ``lo = min(k_positions) - max(q_positions)``.
        u, v: ``(H, D)`` the global content and position biases.
        q_positions: ``(T,)`` query positions.
        k_positions: ``(S,)`` key positions.

    Returns:
        ``(B, H, T, S)`` bias to add to ``q kᵀ / sqrt(D)``.

    Raises:
        ValueError: mismatched shapes.
    """
    B, H, T, D = q.shape
    lo = int(k_positions.min()) - int(q_positions.max())
    N = int(k_positions.max()) - int(q_positions.min()) - lo + 1
    if r.shape != (H, N, D) or u.shape != (H, D) or v.shape != (H, D):
        raise ValueError(f"expected r {(H, N, D)}, u and v {(H, D)}; got {tuple(r.shape)}, {tuple(u.shape)}, {tuple(v.shape)}")
    content = (k * u[:, None, :]).sum(-1)[:, :, None, :]  # (B, H, 1, S): term (c)
    position = (q + v[:, None, :]) @ r.transpose(-2, -1)  # (B, H, T, N): terms (b) + (d), all relative positions
    if _is_shiftable(q_positions, k_positions):
        position = relative_shift(position, k.shape[2])  # (B, H, T, S)
    else:
        index = relative_positions(q_positions, k_positions) - lo  # (T, S)
        position = torch.gather(position, -1, index.expand(B, H, T, -1))  # (B, H, T, S)
    return (position + content) * D**-0.5  # (B, H, T, S)


class TransformerXLPE(PositionMethod):
    """Transformer-XL's relative position method for the tiny LM (no absolute position anywhere).

    ``u`` and ``v`` are shared by all layers, as in the released PyTorch code; the released TensorFlow
    code's ``untie_r`` flag, which its WikiText-103 and One Billion Word scripts set, gives each layer
    its own pair instead. Each layer has its own ``W_{k,R}``. Distances are not clipped (the released
    evaluation scripts clip them at ``clamp_len``).

    Args:
        d_model: ``C``.
        num_heads: ``H``.
        num_layers: number of attention layers.
        base: frequency base of the sinusoids.
        std: initial standard deviation of ``u``, ``v`` and ``W_{k,R}``.

    Parameters: ``u``, ``v`` ``(H, D)``; ``w_kr`` ``(L, C, C)``.
    """

    def __init__(self, d_model: int, num_heads: int, num_layers: int = 1, *, base: float = 10000.0, std: float = 0.02):
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("num_layers", num_layers)):
            check_positive_int(value, name)
        if d_model % num_heads or d_model % 2:
            raise ValueError(f"d_model={d_model} must be even and divisible by num_heads={num_heads}")
        self.d_model, self.num_heads, self.base = d_model, num_heads, base
        D = d_model // num_heads
        self.u = nn.Parameter(torch.randn(num_heads, D) * std)
        self.v = nn.Parameter(torch.randn(num_heads, D) * std)
        self.w_kr = nn.Parameter(torch.randn(num_layers, d_model, d_model) * std)

    def projected_sinusoids(self, relative: Tensor, layer: int, dtype: torch.dtype) -> Tensor:
        """``W_{k,R} R_{-relative}``, split into heads: ``(H, N, D)`` for ``(N,)`` key-minus-query positions."""
        R = transformer_xl_sinusoids(-relative, self.d_model, self.base).to(dtype)  # (N, C), distance = query - key
        r = R @ self.w_kr[layer].to(dtype)  # (N, C)
        return r.view(len(relative), self.num_heads, -1).transpose(0, 1)  # (H, N, D)

    def attention_bias(self, q, k, q_positions, k_positions, layer):
        lo = int(k_positions.min()) - int(q_positions.max())
        hi = int(k_positions.max()) - int(q_positions.min())
        relative = torch.arange(lo, hi + 1, device=q.device)  # (N,)
        r = self.projected_sinusoids(relative, layer, q.dtype)  # (H, N, D)
        return transformer_xl_bias(q, k, r, self.u.to(q.dtype), self.v.to(q.dtype), q_positions, k_positions)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, layers={self.w_kr.shape[0]}"


@register_method("transformer_xl")
def _transformer_xl(config) -> TransformerXLPE:
    return TransformerXLPE(config.d_model, config.n_head, config.n_layer)
