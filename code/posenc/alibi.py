"""ALiBi, attention with linear biases: no position embedding, a fixed per-head penalty on distance.

Press, Smith & Lewis (2022), arXiv:2108.12409, §3: head ``h`` adds ``m_h * (j - i)`` to the logit of
query position ``i`` and key position ``j <= i``, that is ``-m_h`` per token of distance, with
slopes ``m_h`` fixed before training (:func:`alibi_slopes`). Nothing is learned and nothing is added
to the token embeddings. In this package's convention (relative position = key - query, negative in
the past) the causal bias is ``slope * (key_position - query_position)``; the symmetric variant for
encoders (no causal mask) is ``-slope * |key_position - query_position|``, the form of
flash-attention's ``alibi_slopes``. The two agree wherever a causal mask lets a query see a key.

Because the bias depends only on ``key - query``, it needs no table: a query at any position, with a
KV cache or in a left-padded batch, gets the bias of its distances. :func:`positions_from_padding_mask`
gives the per-row positions of a padded batch for code that wants them (Hugging Face's BLOOM builds
its bias that way); with the padding keys masked, ALiBi gives the same logits with or without it.

The bias goes on the logits *after* the ``1/sqrt(D)`` scaling of ``q kᵀ`` (the paper's code, BLOOM,
MPT, flash-attention). ``placement="before_scale"`` adds it before, ``(q kᵀ + m Δ) / sqrt(D)``, as
some write the formula; that is ALiBi with every slope divided by ``sqrt(D)``
(:func:`effective_slopes`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from posenc.method import register_method
from posenc.relative.common import RelativeScalarBias, check_int_tensor, check_positive_int

#: Where the bias is added relative to the ``1/sqrt(D)`` scaling of the logits.
PLACEMENTS = ("after_scale", "before_scale")


def _geometric_slopes(n: int) -> list[float]:
    # n a power of two: m_h = 2^(-8 h / n), h = 1..n, computed in fp64 (exact for n <= 8).
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]


def alibi_slopes(num_heads: int, *, arithmetic: str = "exact") -> Tensor:
    """The ALiBi slope of every head.

    For ``n = num_heads`` a power of two the slopes are the geometric sequence that starts at
    ``2^(-8/n)`` with ratio ``2^(-8/n)``: ``m_h = 2^(-8 h / n)`` for ``h = 1 .. n``, from the
    steepest head to ``2^-8``. For other ``n`` this is the rule of the paper's reference code
    (arXiv:2108.12409, §3 and its repository), which BLOOM and MPT checkpoints also use: with
    ``p`` the largest power of two ``<= n``, the ``p`` slopes of ``p`` heads, then every other
    slope of ``2p`` heads (``m = 2^(-4 (2j + 1) / p)``, ``j = 0 .. n - p - 1``). The result is then
    **not monotonic**: for 6 heads it is ``2^-2, 2^-4, 2^-6, 2^-8, 2^-1, 2^-3``.

    Computed in fp64 and rounded once to fp32 (``arithmetic="exact"``), or as BLOOM's and
    transformers' code computes them (``"transformers"``: an fp32 power of an fp32 base, one fp32
    ulp away for some head counts that are not powers of two, e.g. 2 of 12 heads).

    Args:
        num_heads: number of heads ``H >= 1``.
        arithmetic: ``"exact"`` or ``"transformers"``.

    Returns:
        ``(H,)`` float32 slopes, all in ``(0, 1)``.

    Raises:
        TypeError: if ``num_heads`` is not an int.
        ValueError: if ``num_heads < 1``.
    """
    if not isinstance(num_heads, int) or isinstance(num_heads, bool):
        raise TypeError(f"num_heads must be an int, got {type(num_heads).__name__} {num_heads!r}")
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if arithmetic not in ("exact", "transformers"):
        raise ValueError(f"arithmetic must be 'exact' or 'transformers', got {arithmetic!r}")
    p = 1 << (num_heads.bit_length() - 1)  # largest power of two <= num_heads
    if arithmetic == "transformers":  # powers of the fp32 ratio, as BLOOM's _get_alibi_slopes
        ratio = lambda n: torch.tensor(2.0 ** (-8.0 / n), dtype=torch.float32)  # noqa: E731
        first = torch.pow(ratio(p), torch.arange(1, p + 1, dtype=torch.int32))
        rest = torch.pow(ratio(2 * p), torch.arange(1, 2 * (num_heads - p) + 1, 2, dtype=torch.int32))
        return torch.cat([first, rest])  # (H,)
    slopes = _geometric_slopes(p) + _geometric_slopes(2 * p)[0::2][: num_heads - p]
    return torch.tensor(slopes, dtype=torch.float64).float()  # (H,)


def effective_slopes(slopes: Tensor, placement: str = "after_scale", head_dim: Optional[int] = None) -> Tensor:
    """Slopes to add *after* the ``1/sqrt(D)`` scaling that give the same logits as ``placement``.

    ``"after_scale"``: ``q kᵀ / sqrt(D) + m Δ`` (the paper's code): the slopes unchanged.
    ``"before_scale"``: ``(q kᵀ + m Δ) / sqrt(D)``: slopes ``m / sqrt(D)``.

    Args:
        slopes: ``(H,)`` float slopes.
        placement: one of :data:`PLACEMENTS`.
        head_dim: ``D``, required for ``"before_scale"``.

    Returns:
        ``(H,)`` float32 slopes.

    Raises:
        ValueError: unknown placement, or ``"before_scale"`` without a positive ``head_dim``.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    slopes = slopes.float()
    if placement == "after_scale":
        return slopes
    check_positive_int(head_dim, "head_dim")
    return slopes / math.sqrt(head_dim)


def alibi_bias(slopes: Tensor, q_positions: Tensor, k_positions: Tensor, *, symmetric: bool = False) -> Tensor:
    """ALiBi logit bias of every head for every (query, key) pair.

    Causal (decoders): ``slope_h * (k_positions[s] - q_positions[t])``, i.e. ``-m (i - j)`` for a
    key ``j`` at or before query ``i``; keys after the query get positive values and must be masked,
    as in causal attention. Symmetric (encoders): ``-slope_h * |k_positions[s] - q_positions[t]|``.

    Positions may carry batch dims, e.g. ``(B, T)`` and ``(B, S)`` from
    :func:`positions_from_padding_mask`, or be shared ``(T,)`` and ``(S,)``; their leading dims
    broadcast.

    Args:
        slopes: ``(H,)`` float slopes (:func:`alibi_slopes`).
        q_positions: ``(..., T)`` integer query positions.
        k_positions: ``(..., S)`` integer key positions.
        symmetric: use ``-m |Δ|`` instead of ``m Δ``.

    Returns:
        ``(..., H, T, S)`` float32 bias (``(H, T, S)`` for 1-D positions), on the positions' device.

    Raises:
        TypeError: non-float slopes or non-integer positions.
        ValueError: slopes not 1-D, positions with no dims, or leading dims that do not broadcast.
    """
    if not isinstance(slopes, Tensor) or not slopes.dtype.is_floating_point:
        raise TypeError(f"slopes must be a floating-point tensor, got {getattr(slopes, 'dtype', type(slopes).__name__)}")
    if slopes.dim() != 1:
        raise ValueError(f"slopes must be 1-D (H,), got shape {tuple(slopes.shape)}")
    check_int_tensor(q_positions, "q_positions")
    check_int_tensor(k_positions, "k_positions")
    if q_positions.dim() < 1 or k_positions.dim() < 1:
        raise ValueError(
            f"q_positions and k_positions need a last (T or S) dim, got shapes {tuple(q_positions.shape)} and {tuple(k_positions.shape)}"
        )
    try:
        torch.broadcast_shapes(q_positions.shape[:-1], k_positions.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"leading dims of q_positions {tuple(q_positions.shape)} and k_positions {tuple(k_positions.shape)} do not broadcast"
        ) from None
    relative = k_positions.long().unsqueeze(-2) - q_positions.long().unsqueeze(-1)  # (..., T, S)
    if symmetric:
        relative = -relative.abs()
    m = slopes.to(device=relative.device, dtype=torch.float32)[:, None, None]  # (H, 1, 1)
    return m * relative.unsqueeze(-3).float()  # (..., H, T, S)


def uniform_attention(slopes: Tensor, context: int) -> Tensor:
    """Attention weights by distance of a query that sees ``context`` keys of equal content.

    With every ``q·k`` equal, only the bias differs, so the last query of a causal window puts weight
    ``exp(-m d) / sum_d' exp(-m d')`` on the key at distance ``d = 0 .. context - 1``: a truncated
    geometric distribution, one per head.

    Args:
        slopes: ``(H,)`` slopes (after :func:`effective_slopes`).
        context: number of keys the query sees (itself included), ``>= 1``.

    Returns:
        ``(H, context)`` float64 weights; row ``h`` sums to 1, column ``d`` is distance ``d``.

    Raises:
        ValueError: if ``context < 1``.
    """
    check_positive_int(context, "context")
    d = torch.arange(context, dtype=torch.float64)  # (context,)
    return torch.softmax(-slopes.double().cpu()[:, None] * d, dim=-1)  # (H, context)


def attention_reach(slopes: Tensor, context: Optional[int] = None, mass: float = 0.9) -> Tensor:
    """Smallest distance ``d`` such that keys at distances ``0 .. d`` hold ``mass`` of a head's attention.

    For content that is the same everywhere (:func:`uniform_attention`), with ``r = exp(-m)`` the
    keys within distance ``d`` hold ``(1 - r^(d+1)) / (1 - r^c)`` of the weight, so the reach is
    ``ceil(-ln(1 - mass (1 - r^c)) / m) - 1``; for an unbounded context (``context=None``),
    ``ceil(ln(1 / (1 - mass)) / m) - 1``, which is about ``2.3 / m`` for ``mass = 0.9``. A head
    whose reach is close to ``context - 1`` spreads its attention over the whole window.

    Args:
        slopes: ``(H,)`` positive slopes.
        context: number of keys the query sees, or ``None`` for an unbounded context.
        mass: fraction of the attention, in ``(0, 1)``.

    Returns:
        ``(H,)`` int64 distances (``<= context - 1`` when ``context`` is given).

    Raises:
        ValueError: non-positive slopes, ``mass`` outside ``(0, 1)`` or ``context < 1``.
    """
    if not 0.0 < mass < 1.0:
        raise ValueError(f"mass must be in (0, 1), got {mass!r}")
    m = slopes.double().cpu()  # (H,)
    if not bool((m > 0).all()):
        raise ValueError(f"slopes must all be > 0, got {slopes.tolist()}")
    if context is None:
        target = torch.full_like(m, 1.0 - mass)  # r^(d+1) <= 1 - mass
    else:
        check_positive_int(context, "context")
        target = 1.0 + mass * torch.expm1(-m * context)  # 1 - mass (1 - r^c)
    reach = torch.ceil(-torch.log(target) / m - 1e-9).long() - 1  # (H,); 1e-9 guards exact edges
    return reach.clamp(min=0) if context is None else reach.clamp(0, context - 1)


def positions_from_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """Per-row positions of a padded batch: each real token's index among the real tokens of its row.

    With left padding, row ``b``'s first real token gets position 0 whatever the padding before it
    (the positions Hugging Face models derive from ``attention_mask.cumsum(-1) - 1``). Padding
    slots get position 0; their keys must be masked anyway.

    Args:
        key_padding_mask: ``(B, S)`` bool, ``True`` at padding (``posenc``'s mask convention).

    Returns:
        ``(B, S)`` int64 positions.

    Raises:
        TypeError: if the mask is not a bool tensor.
        ValueError: if it is not 2-D.
    """
    if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
        got = getattr(key_padding_mask, "dtype", type(key_padding_mask).__name__)
        raise TypeError(
            f"key_padding_mask must be a bool tensor (True = padding), got {got}; "
            "a Hugging Face attention_mask (1 = keep) converts as `attention_mask == 0`"
        )
    if key_padding_mask.dim() != 2:
        raise ValueError(f"key_padding_mask must have shape (B, S), got {tuple(key_padding_mask.shape)}")
    keep = (~key_padding_mask).long()  # (B, S)
    return ((keep.cumsum(-1) - 1) * keep).clamp(min=0)  # (B, S)


class ALiBi(RelativeScalarBias):
    """ALiBi as a position method of the tiny LM: a fixed bias per head, no parameters.

    The bias ``effective_slopes[h] * Δ`` (``Δ`` = key - query; ``-|Δ|`` when ``symmetric``) comes
    from :class:`~posenc.relative.common.RelativeScalarBias`: a materialised ``(1, H, T, S)`` tensor
    for the reference and SDPA backends, and a function reading an ``(H, T + S - 1)`` table inside
    the flex kernel, so no ``T x S`` tensor is built there. Works at every position (no table to
    outgrow) and with a KV cache.

    Args:
        num_heads: ``H``.
        symmetric: ``-m |Δ|`` (encoders) instead of the causal ``m Δ``.
        placement: where the bias is added relative to the ``1/sqrt(D)`` scaling (:data:`PLACEMENTS`);
            ``"before_scale"`` needs ``head_dim``.
        head_dim: ``D``.
        slopes: optional ``(H,)`` slopes to use instead of :func:`alibi_slopes` (e.g. for ablations).

    Buffers: ``slopes`` ``(H,)`` float32, non-persistent (recomputed, not loaded) and kept in fp32
    when the model is cast.

    Raises:
        TypeError: if ``symmetric`` is not a bool.
        ValueError: invalid ``num_heads``, ``placement``, ``head_dim`` or ``slopes``.
    """

    def __init__(
        self,
        num_heads: int,
        *,
        symmetric: bool = False,
        placement: str = "after_scale",
        head_dim: Optional[int] = None,
        slopes: Optional[Tensor] = None,
    ):
        super().__init__()
        if not isinstance(symmetric, bool):
            raise TypeError(f"symmetric must be a bool, got {type(symmetric).__name__}")
        ambient = torch.empty(0).device  # the meta device under deferred initialisation
        with torch.device("cpu"):
            base = alibi_slopes(num_heads) if slopes is None else slopes
        if not isinstance(base, Tensor) or not base.dtype.is_floating_point or tuple(base.shape) != (num_heads,):
            raise ValueError(
                f"slopes must be a float tensor of shape (num_heads,) = ({num_heads},), got "
                f"{getattr(base, 'dtype', type(base).__name__)} {tuple(getattr(base, 'shape', ()))}"
            )
        self.num_heads, self.symmetric, self.placement, self.head_dim = num_heads, symmetric, placement, head_dim
        if base.is_meta:
            raise ValueError("slopes must hold values (they are on the meta device); give them on a real device")
        self._base = base.detach().double().cpu()  # kept to rebuild the buffer in fp32 after casts
        buffer = effective_slopes(self._base, placement, head_dim)  # (H,)
        self.register_buffer("slopes", buffer.to("meta") if ambient.type == "meta" else buffer, persistent=False)

    def _apply(self, fn, recurse=True):
        was_meta = self.slopes.is_meta
        super()._apply(fn, recurse)
        # a model-wide cast: rebuild, never round; leaving the meta device (to_empty): compute the values
        if self.slopes.dtype != torch.float32 or (was_meta and not self.slopes.is_meta):
            device = self.slopes.device
            self.slopes = effective_slopes(self._base, self.placement, self.head_dim).to(device)
        return self

    def relative_bias(self, relative: Tensor, layer: int) -> Tensor:
        """``(H, N)`` bias of relative positions ``relative`` ``(N,)`` (the same in every layer)."""
        r = relative.float()  # (N,)
        return self.slopes[:, None] * (-r.abs() if self.symmetric else r)  # (H, N)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, symmetric={self.symmetric}, placement={self.placement!r}"


@register_method("alibi")
def _alibi(config) -> ALiBi:
    return ALiBi(config.n_head)
