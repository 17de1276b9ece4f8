"""T5's relative attention bias: one learned scalar per (head, log-spaced bucket of relative position).

Raffel et al. 2020, arXiv:1910.10683, §2.1: "each 'embedding' is simply a scalar added to the
corresponding logit"; 32 buckets whose width grows logarithmically up to a distance of 128, beyond
which every distance shares the last bucket; one table shared by all layers. The bucket rule is the
one of the Mesh TensorFlow code that T5 checkpoints were trained with (and that Hugging Face's
``T5Attention._relative_position_bucket`` reproduces); its argument is ``key - query``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.method import register_method
from posenc.relative.common import RelativeScalarBias, check_int_tensor, check_positive_int


def check_t5_bucket_args(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__}")
    check_positive_int(num_buckets, "num_buckets", minimum=4 if bidirectional else 2)
    if bidirectional and num_buckets % 2:
        raise ValueError(f"num_buckets must be even when bidirectional (half per direction), got {num_buckets}")
    exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance <= exact:
        raise ValueError(
            f"max_distance must be an int greater than the exact range {exact} "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional}), got {max_distance!r}"
        )


def t5_relative_bucket(
    relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket id of each relative position ``key - query``.

    With ``n = num_buckets`` (halved when ``bidirectional``, the upper half then holding keys
    *after* the query) and ``e = n // 2``: distances ``d < e`` get their own bucket ``d``; larger
    ones get ``e + floor(log(d / e) / log(max_distance / e) * (n - e))``, capped at ``n - 1``, so
    every distance ``>= max_distance`` shares the last bucket. When not bidirectional (decoders)
    keys after the query all map to bucket 0, the query's own bucket. When bidirectional, bucket
    ``n`` (the upper half's distance 0) is never used, since ``key == query`` is in the lower half. The logarithm is taken in
    float32, as in the checkpoints' code, so that bucket edges match it exactly.

    Args:
        relative_position: integer tensor of any shape, ``key_position - query_position``.
        bidirectional: distinguish keys before and after the query (encoders) or not (decoders).
        num_buckets: number of buckets ``n`` (even and ``>= 4`` if bidirectional, ``>= 2`` otherwise).
        max_distance: distance from which all positions share the last bucket; must exceed the
            exact range ``e``.

    Returns:
        int64 tensor of bucket ids in ``0 .. num_buckets - 1``, same shape and device.

    Raises:
        TypeError: if ``relative_position`` is not an integer tensor or ``bidirectional`` not a bool.
        ValueError: for ``num_buckets`` or ``max_distance`` outside the ranges above.
    """
    check_int_tensor(relative_position, "relative_position")
    check_t5_bucket_args(bidirectional, num_buckets, max_distance)
    r = relative_position.long()
    if bidirectional:
        n = num_buckets // 2
        offset = torch.where(r > 0, n, 0)  # keys after the query use the upper half
        distance = r.abs()
    else:
        n = num_buckets
        offset = torch.zeros_like(r)
        distance = torch.clamp(-r, min=0)  # keys after the query count as distance 0
    exact = n // 2
    # log-spaced buckets for distance >= exact; clamp the log's argument to avoid log(0) where unused
    ratio = torch.clamp(distance, min=exact).float() / exact
    log_bucket = exact + (torch.log(ratio) / math.log(max_distance / exact) * (n - exact)).long()
    log_bucket = torch.clamp(log_bucket, max=n - 1)
    return offset + torch.where(distance < exact, distance, log_bucket)


def t5_bias(
    weight: Tensor,
    q_positions: Tensor,
    k_positions: Tensor,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
) -> Tensor:
    """T5's relative attention bias as a pure function of its table and the positions.

    ``bias[..., h, t, s] = weight[bucket(k_s - q_t), h]`` with :func:`t5_relative_bucket`: what
    Hugging Face's ``T5Attention.compute_bias`` returns, for any positions (a decoding step against
    a cache, or a left-padded row's positions, per batch row).

    Args:
        weight: ``(num_buckets, H)``: Hugging Face's ``relative_attention_bias.weight`` as it is
            (an ``nn.Embedding(num_buckets, n_heads)``); ``num_buckets`` is its first dim.
        q_positions: ``(T,)`` or per batch row ``(B, T)`` integer positions of the queries.
        k_positions: ``(S,)`` or ``(B, S)`` integer positions of the keys.
        bidirectional: ``True`` for an encoder, ``False`` for a decoder (Hugging Face's
            ``not is_decoder``).
        max_distance: T5's ``relative_attention_max_distance`` (128).

    Returns:
        ``(H, T, S)``, or ``(B, H, T, S)`` where a position tensor has a batch dim; ``weight``'s dtype.

    Raises:
        TypeError: a non-float ``weight``, non-integer positions.
        ValueError: ``weight`` that is not 2-D, positions that are not 1-D or 2-D or whose batch
            dims disagree; bucket arguments as in :func:`t5_relative_bucket`.
    """
    if not isinstance(weight, Tensor) or not weight.dtype.is_floating_point:
        raise TypeError(f"weight must be a float tensor (num_buckets, H), got {getattr(weight, 'dtype', type(weight).__name__)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must have shape (num_buckets, H) (Hugging Face's layout), got {tuple(weight.shape)}")
    for name, p in (("q_positions", q_positions), ("k_positions", k_positions)):
        check_int_tensor(p, name)
        if p.dim() not in (1, 2):
            raise ValueError(f"{name} must have shape (N,) or (B, N), got {tuple(p.shape)}")
    if q_positions.dim() == k_positions.dim() == 2 and q_positions.shape[0] != k_positions.shape[0]:
        raise ValueError(f"q_positions and k_positions disagree on the batch: {tuple(q_positions.shape)}, {tuple(k_positions.shape)}")
    relative = k_positions.long().unsqueeze(-2) - q_positions.long().unsqueeze(-1)  # (T, S) or (B, T, S)
    buckets = t5_relative_bucket(relative, bidirectional, weight.shape[0], max_distance)
    return weight[buckets].movedim(-1, -3)  # (..., H, T, S)


class T5RelativeBias(RelativeScalarBias):
    """T5's learned per-head scalar bias of the relative bucket, added to the attention logits.

    Args:
        num_heads: ``H``.
        num_buckets, max_distance, bidirectional: as in :func:`t5_relative_bucket`
            (T5's defaults; a decoder-only LM uses ``bidirectional=False``).
        per_layer: one table per layer instead of T5's single shared table.
        num_layers: number of layers (needed only when ``per_layer``).
        std: initial standard deviation of the table.

    Parameters: ``weight`` ``(L or 1, num_buckets, H)``.
    """

    def __init__(
        self,
        num_heads: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        per_layer: bool = False,
        num_layers: int = 1,
        std: float = 0.02,
    ):
        super().__init__()
        check_positive_int(num_heads, "num_heads")
        check_positive_int(num_layers, "num_layers")
        check_t5_bucket_args(bidirectional, num_buckets, max_distance)
        self.num_heads, self.num_buckets, self.max_distance = num_heads, num_buckets, max_distance
        self.bidirectional, self.per_layer = bidirectional, per_layer
        self.weight = nn.Parameter(torch.randn(num_layers if per_layer else 1, num_buckets, num_heads) * std)

    def relative_bias(self, relative: Tensor, layer: int) -> Tensor:
        buckets = t5_relative_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)  # (N,)
        return self.weight[layer if self.per_layer else 0][buckets].T  # (H, N)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}, per_layer={self.per_layer}"
        )


@register_method("t5")
def _t5(config) -> T5RelativeBias:
    # Decoder-only LM: keys after the query are masked, so one direction suffices (T5's decoder setting).
    return T5RelativeBias(config.n_head, num_buckets=32, max_distance=config.max_len, bidirectional=False)
