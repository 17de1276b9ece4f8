"""DeBERTa's disentangled attention: content-to-content, content-to-position and position-to-content.

He et al. 2021, arXiv:2006.03654, §3.1, eqs. (3)-(4): with relative embeddings ``P`` ``(2k, C)``
shared by all layers and per-layer projections ``Q^r = P W_{q,r}``, ``K^r = P W_{k,r}``,

    Ã_ij = Q^c_i·K^c_j + Q^c_i·K^r_{δ(i,j)} + K^c_j·Q^r_{δ(·)},      softmax(Ã / sqrt(3D)),
    δ(i,j) = clip(i - j + k, 0, 2k - 1)   (i - j = query minus key; this module converts)

The paper writes the position-to-content row as ``δ(j, i)``; the released code (and Hugging Face's
port, which DeBERTa checkpoints are used with) gathers it with ``δ(i, j)``, the same row as
content-to-position. The two are different models; ``p2c="code"`` (default) follows the code,
``p2c="paper"`` the equation. DeBERTa-v2/v3 first map the distance to log-spaced buckets
(:func:`deberta_log_bucket`); the enhanced mask decoder (absolute positions added just before the
output layer) is not part of the attention and not implemented here.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.method import PositionMethod, register_method
from posenc.relative.common import check_int_tensor, check_positive_int, relative_positions

P2C_CONVENTIONS = ("code", "paper")


def deberta_log_bucket(relative_position: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """DeBERTa-v2's log buckets: exact up to ``bucket_size // 2``, log-spaced up to ``max_position``.

    With ``m = bucket_size // 2``: ``|r| <= m`` maps to ``r``; larger distances map to
    ``sign(r) * (m + ceil(log(|r| / m) / log((max_position - 1) / m) * (m - 1)))``, which reaches
    ``±(2m - 1)`` at ``|r| = max_position - 1`` and keeps growing past it (the caller clips).
    The function is odd, so it can be applied to ``key - query`` or ``query - key`` alike.
    Computed in float32, like the checkpoints' code, so bucket edges match it.

    Args:
        relative_position: integer tensor, any shape.
        bucket_size: number of buckets per direction, ``>= 2`` (DeBERTa-v3: 256).
        max_position: distance of the last bucket, ``> bucket_size // 2 + 1`` (DeBERTa-v3: 512).

    Returns:
        int64 bucketed positions, same shape and sign.

    Raises:
        TypeError: non-integer ``relative_position``.
        ValueError: ``bucket_size < 2`` or ``max_position`` too small for any log bucket.
    """
    check_int_tensor(relative_position, "relative_position")
    check_positive_int(bucket_size, "bucket_size", minimum=2)
    mid = bucket_size // 2
    check_positive_int(max_position, "max_position", minimum=mid + 2)
    r = relative_position.long()
    distance = r.abs()
    safe = torch.clamp(distance, min=mid).float()  # log argument >= 1 where it is used
    log_pos = torch.ceil(torch.log(safe / mid) / math.log((max_position - 1) / mid) * (mid - 1)).long() + mid
    return torch.where(distance <= mid, r, torch.sign(r) * log_pos)


def deberta_relative_ids(
    relative_position: Tensor, span: int, *, max_position: int | None = None, p2c: str = "code"
) -> tuple[Tensor, Tensor]:
    """Rows of ``K^r`` (content-to-position) and ``Q^r`` (position-to-content) for each (query, key).

    Args:
        relative_position: integer tensor, ``key_position - query_position``.
        span: ``k``, half the number of rows of ``P`` (``2k`` rows). With ``max_position``, this is
            also the bucket size of :func:`deberta_log_bucket` (DeBERTa-v2's ``position_buckets``).
        max_position: enable log buckets up to this distance (``None``: plain clipping, DeBERTa v1).
        p2c: ``"code"`` (position-to-content uses ``δ(i, j)``, as the released code) or
            ``"paper"`` (``δ(j, i)``, as eq. 4).

    Returns:
        ``(c2p_ids, p2c_ids)``, int64 in ``0 .. 2k - 1``, each of the shape of ``relative_position``.

    Raises:
        TypeError: if ``relative_position`` is not an integer tensor.
        ValueError: if ``span`` is not a positive int, ``max_position`` is out of range, or ``p2c`` is unknown.
    """
    check_int_tensor(relative_position, "relative_position")
    check_positive_int(span, "span")
    if p2c not in P2C_CONVENTIONS:
        raise ValueError(f"p2c must be one of {P2C_CONVENTIONS}, got {p2c!r}")
    d = -relative_position.long()  # query - key, the paper's i - j
    if max_position is not None:
        d = deberta_log_bucket(d, span, max_position)
    c2p_ids = torch.clamp(d + span, 0, 2 * span - 1)
    p2c_ids = c2p_ids if p2c == "code" else torch.clamp(-d + span, 0, 2 * span - 1)
    return c2p_ids, p2c_ids


def deberta_bias(q: Tensor, k: Tensor, q_rel: Tensor, k_rel: Tensor, c2p_ids: Tensor, p2c_ids: Tensor) -> Tensor:
    """Content-to-position plus position-to-content, divided by ``sqrt(3D)``.

    Each term is one matmul against the ``2k`` relative rows, then a gather (never a
    ``(B, H, T, S, D)`` tensor).

    Args:
        q: ``(B, H, T, D)`` content queries ``Q^c``.
        k: ``(B, H, S, D)`` content keys ``K^c``.
        q_rel: ``(H, 2k, D)`` relative queries ``Q^r``.
        k_rel: ``(H, 2k, D)`` relative keys ``K^r``.
        c2p_ids, p2c_ids: ``(T, S)`` from :func:`deberta_relative_ids`.

    Returns:
        ``(B, H, T, S)``; add it to ``Q^c K^cᵀ / sqrt(3D)``.

    Raises:
        ValueError: mismatched shapes.
    """
    B, H, T, D = q.shape
    S = k.shape[2]
    if q_rel.shape != k_rel.shape or q_rel.dim() != 3 or q_rel.shape[0] != H or q_rel.shape[2] != D:
        raise ValueError(f"q_rel and k_rel must both be (H, 2k, D) = ({H}, 2k, {D}), got {tuple(q_rel.shape)}, {tuple(k_rel.shape)}")
    if c2p_ids.shape != (T, S) or p2c_ids.shape != (T, S):
        raise ValueError(f"c2p_ids and p2c_ids must be (T, S) = {(T, S)}, got {tuple(c2p_ids.shape)}, {tuple(p2c_ids.shape)}")
    c2p = torch.gather(q @ k_rel.transpose(-2, -1), -1, c2p_ids.expand(B, H, T, S))  # (B, H, T, S)
    p2c = torch.gather(k @ q_rel.transpose(-2, -1), -1, p2c_ids.T.expand(B, H, S, T))  # (B, H, S, T)
    return (c2p + p2c.transpose(-2, -1)) / math.sqrt(3 * D)  # (B, H, T, S)


class DebertaPE(PositionMethod):
    """DeBERTa's disentangled relative attention for the tiny LM (no absolute position).

    ``P`` is shared by all layers; each layer projects it with its own ``W_{q,r}``, ``W_{k,r}``
    (DeBERTa v1; v2's ``share_att_key`` reuses the content projections instead). The content
    logit is rescaled from ``1/sqrt(D)`` to ``1/sqrt(3D)`` by dividing the queries by ``sqrt(3)``.

    Args:
        d_model: ``C``.
        num_heads: ``H``.
        num_layers: number of attention layers.
        span: ``k`` (``2k`` relative rows).
        max_position: enable log buckets (see :func:`deberta_relative_ids`).
        p2c: ``"code"`` or ``"paper"`` (see the module docstring).
        std: initial standard deviation.

    Parameters: ``rel`` ``(2k, C)``; ``w_qr``, ``w_kr`` ``(L, C, C)``.
    """

    def __init__(self, d_model: int, num_heads: int, num_layers: int = 1, *, span: int = 32,
                 max_position: int | None = None, p2c: str = "code", std: float = 0.02):
        super().__init__()
        for name, value in (("d_model", d_model), ("num_heads", num_heads), ("num_layers", num_layers), ("span", span)):
            check_positive_int(value, name)
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        deberta_relative_ids(torch.zeros(1, dtype=torch.long), span, max_position=max_position, p2c=p2c)  # validates
        self.num_heads, self.span, self.max_position, self.p2c = num_heads, span, max_position, p2c
        self.rel = nn.Parameter(torch.randn(2 * span, d_model) * std)
        self.w_qr = nn.Parameter(torch.randn(num_layers, d_model, d_model) * std)
        self.w_kr = nn.Parameter(torch.randn(num_layers, d_model, d_model) * std)

    def relative_projections(self, layer: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``(Q^r, K^r)``, each ``(H, 2k, D)``."""
        rel = self.rel.to(dtype)
        split = lambda x: x.view(2 * self.span, self.num_heads, -1).transpose(0, 1)  # noqa: E731  (H, 2k, D)
        return split(rel @ self.w_qr[layer].to(dtype)), split(rel @ self.w_kr[layer].to(dtype))

    def ids(self, q_positions: Tensor, k_positions: Tensor) -> tuple[Tensor, Tensor]:
        """``(c2p_ids, p2c_ids)``, each ``(T, S)``."""
        rel = relative_positions(q_positions, k_positions)
        return deberta_relative_ids(rel, self.span, max_position=self.max_position, p2c=self.p2c)

    def transform_qk(self, q, k, q_positions, k_positions, layer):
        return q / math.sqrt(3.0), k  # content logit q·k / sqrt(3D) under attention's 1/sqrt(D)

    def attention_bias(self, q, k, q_positions, k_positions, layer):
        q_rel, k_rel = self.relative_projections(layer, q.dtype)
        # q arrives divided by sqrt(3); undo it so that deberta_bias sees the content queries.
        return deberta_bias(q * math.sqrt(3.0), k, q_rel, k_rel, *self.ids(q_positions, k_positions))

    def attention_bias_fn(self, q, k, q_positions, k_positions, layer):
        q_rel, k_rel = self.relative_projections(layer, q.dtype)
        scale = 1.0 / math.sqrt(3 * q.shape[-1])
        c2p = (q * math.sqrt(3.0)) @ k_rel.transpose(-2, -1) * scale  # (B, H, T, 2k)
        p2c = k @ q_rel.transpose(-2, -1) * scale  # (B, H, S, 2k)
        lo = int(k_positions.min()) - int(q_positions.max())
        hi = int(k_positions.max()) - int(q_positions.min())
        c2p_lut, p2c_lut = deberta_relative_ids(
            torch.arange(lo, hi + 1, device=q.device), self.span, max_position=self.max_position, p2c=self.p2c
        )  # (N,) each
        qp, kp = q_positions.long(), k_positions.long()

        def bias_fn(b, h, q_idx, kv_idx):
            r = kp[kv_idx] - qp[q_idx] - lo
            return c2p[b, h, q_idx, c2p_lut[r]] + p2c[b, h, kv_idx, p2c_lut[r]]

        return bias_fn

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, span={self.span}, max_position={self.max_position}, p2c={self.p2c!r}"


@register_method("deberta")
def _deberta(config) -> DebertaPE:
    return DebertaPE(config.d_model, config.n_head, config.n_layer, span=32, max_position=config.max_len)
