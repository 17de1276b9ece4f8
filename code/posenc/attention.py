"""Scaled dot-product attention with the hooks through which position enters.

:func:`attention` is the pure computation (Vaswani et al. 2017, arXiv:1706.03762, eq. 1) with an
optional additive logit bias, a causal mask and a key-padding mask, in two interchangeable
backends: ``"reference"`` (explicit matmul + softmax; can return the weights) and ``"sdpa"``
(``torch.nn.functional.scaled_dot_product_attention``). :class:`SelfAttention` is the multi-head
layer of the tiny LM; it asks a :class:`~posenc.method.PositionMethod` for the query/key
transform and the logit bias.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.method import PositionMethod, check_positions

BACKENDS = ("reference", "sdpa")


def causal_mask(t: int, s: int, device: Union[torch.device, str, None] = None) -> Tensor:
    """Boolean mask of the keys each query may **not** see under causal attention.

    Queries are the last ``t`` of the ``s`` key positions (bottom-right alignment, as with a KV
    cache): query ``i`` sits at key index ``i + s - t`` and sees keys ``0 .. i + s - t``.

    Args:
        t: number of queries ``T``.
        s: number of keys ``S`` (``s >= t``).
        device: device of the result.

    Returns:
        ``(T, S)`` bool tensor, ``True`` where attention is removed.

    Raises:
        ValueError: if ``t < 1`` or ``s < t``.
    """
    if t < 1 or s < t:
        raise ValueError(f"causal_mask needs 1 <= t <= s, got t={t}, s={s}")
    q_index = torch.arange(t, device=device).unsqueeze(1) + (s - t)  # (T, 1)
    k_index = torch.arange(s, device=device).unsqueeze(0)  # (1, S)
    return k_index > q_index  # (T, S)


def _validate(q: Tensor, k: Tensor, v: Tensor, bias, key_padding_mask, causal: bool, backend: str) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, L, D), got shape {tuple(x.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"q, k, v must agree on (B, H); got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the head dim D; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must share the key length S; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    B, H, T, _ = q.shape
    S = k.shape[2]
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if causal and T > S:
        raise ValueError(f"causal attention needs T <= S (queries are the last T keys), got T={T}, S={S}")
    if bias is not None:
        if not isinstance(bias, Tensor) or not bias.dtype.is_floating_point:
            raise TypeError(f"bias must be a floating-point tensor, got {getattr(bias, 'dtype', type(bias).__name__)}")
        try:
            shape = torch.broadcast_shapes(bias.shape, (B, H, T, S))
        except RuntimeError:
            shape = None
        if shape != (B, H, T, S):
            raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast to (B, H, T, S) = {(B, H, T, S)}")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
            got = getattr(key_padding_mask, "dtype", type(key_padding_mask).__name__)
            raise TypeError(
                f"key_padding_mask must be a bool tensor (True = padding, ignored), got {got}; "
                "a Hugging Face attention_mask (1 = keep) converts as `attention_mask == 0`"
            )
        if tuple(key_padding_mask.shape) != (B, S):
            raise ValueError(f"key_padding_mask must have shape (B, S) = {(B, S)}, got {tuple(key_padding_mask.shape)}")


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    bias: Optional[Tensor] = None,
    causal: bool = False,
    key_padding_mask: Optional[Tensor] = None,
    scale: Optional[float] = None,
    backend: str = "reference",
    return_weights: bool = False,
) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """Scaled dot-product attention ``softmax(q kᵀ · scale + bias + mask) v``.

    Implements Vaswani et al. (2017), arXiv:1706.03762, eq. (1), with an additive logit bias
    (the hook used by ALiBi, T5 and Shaw-style methods). A query whose keys are all removed by
    the masks gets a zero output (and zero weights) instead of NaN.

    Args:
        q: ``(B, H, T, D)`` queries.
        k: ``(B, H, S, D)`` keys.
        v: ``(B, H, S, Dv)`` values.
        bias: optional float tensor broadcastable to ``(B, H, T, S)``, added to the logits.
            The ``"reference"`` backend adds it in fp32 (or fp64); ``"sdpa"`` casts it to ``q.dtype``.
        causal: remove keys after each query; queries are the last ``T`` of the ``S`` keys
            (see :func:`causal_mask`).
        key_padding_mask: optional ``(B, S)`` bool, ``True`` where the key is padding.
        scale: logit scale; default ``1 / sqrt(D)``.
        backend: ``"reference"`` (explicit computation, logits and softmax in at least fp32)
            or ``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention``).
        return_weights: also return the attention weights (``"reference"`` backend only).

    Returns:
        ``(B, H, T, Dv)`` output in the dtype of ``v``; with ``return_weights``, also the
        ``(B, H, T, S)`` weights (rows sum to 1, or to 0 for fully masked queries).

    Raises:
        TypeError: non-tensor or non-float inputs, mixed dtypes, a non-bool padding mask.
        ValueError: inconsistent shapes (the message names the tensors and their shapes),
            an unknown backend, ``causal`` with ``T > S``, ``return_weights`` with ``"sdpa"``.
    """
    _validate(q, k, v, bias, key_padding_mask, causal, backend)
    if return_weights and backend != "reference":
        raise ValueError(f"return_weights=True needs backend='reference', got backend={backend!r}")
    B, H, T, D = q.shape
    S = k.shape[2]
    scale = D**-0.5 if scale is None else float(scale)

    # Combined boolean mask, True = removed, broadcastable to (B, H, T, S).
    mask = None
    if causal:
        mask = causal_mask(T, S, device=q.device)  # (T, S)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
        mask = pad if mask is None else (mask | pad)
    dead = None  # queries with no visible key: attend to everything, then zero the output
    if mask is not None:
        dead = mask.all(dim=-1, keepdim=True)  # (..., T, 1)
        mask = mask & ~dead

    if backend == "reference":
        work = torch.promote_types(q.dtype, torch.float32)
        scores = (q.to(work) @ k.to(work).transpose(-2, -1)) * scale  # (B, H, T, S)
        if bias is not None:
            scores = scores + bias.to(work)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        if dead is not None:
            weights = weights.masked_fill(dead, 0.0)
        out = (weights @ v.to(work)).to(v.dtype)  # (B, H, T, Dv)
        return (out, weights) if return_weights else out

    attn_mask = None if bias is None else bias.to(q.dtype)
    is_causal = False
    if mask is not None:
        if causal and T == S and key_padding_mask is None and attn_mask is None:
            is_causal = True  # let SDPA pick its fused causal kernel
        elif attn_mask is None:
            attn_mask = ~mask  # SDPA's bool convention: True = attend
        else:
            attn_mask = torch.where(mask, float("-inf"), attn_mask)  # broadcasts bias and mask both ways
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out  # (B, H, T, Dv)


class SelfAttention(nn.Module):
    """Multi-head self-attention whose position handling is delegated to a position method.

    Holds the query/key/value and output projections; position enters through
    ``method.transform_qk`` and ``method.attention_bias`` in :meth:`forward`.

    Args:
        d_model: model width ``C``.
        n_head: number of heads ``H``; must divide ``d_model``.
        bias: whether the projections have biases.
        backend: ``"sdpa"`` (default) or ``"reference"``, passed to :func:`attention`.

    Raises:
        ValueError: if ``n_head`` does not divide ``d_model`` or the backend is unknown.
    """

    def __init__(self, d_model: int, n_head: int, *, bias: bool = False, backend: str = "sdpa"):
        super().__init__()
        if n_head < 1 or d_model % n_head != 0:
            raise ValueError(f"n_head must be a positive divisor of d_model={d_model}, got n_head={n_head}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.n_head, self.head_dim, self.backend = n_head, d_model // n_head, backend
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        method: PositionMethod,
        *,
        layer: int = 0,
        causal: bool = True,
        key_padding_mask: Optional[Tensor] = None,
        return_weights: bool = False,
    ) -> Union[Tensor, tuple[Tensor, Tensor]]:
        """Attend from every token to the (earlier, if ``causal``) tokens of ``x``.

        Args:
            x: ``(B, T, C)`` inputs.
            positions: ``(T,)`` integer positions of the tokens.
            method: the position method supplying ``transform_qk`` and ``attention_bias``.
            layer: index of this layer, passed to the method's hooks.
            causal: apply the causal mask.
            key_padding_mask: optional ``(B, T)`` bool, ``True`` at padding tokens.
            return_weights: also return ``(B, H, T, T)`` attention weights (uses the reference backend).

        Returns:
            ``(B, T, C)`` outputs, and the weights if requested.
        """
        if x.dim() != 3:
            raise ValueError(f"x must have shape (B, T, C), got {tuple(x.shape)}")
        B, T, C = x.shape
        check_positions(positions)
        if positions.numel() != T:
            raise ValueError(f"positions has {positions.numel()} entries but x has T={T} tokens")
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (z.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        q, k = method.transform_qk(q, k, positions, positions, layer)
        bias = method.attention_bias(q, k, positions, positions, layer)
        backend = "reference" if return_weights else self.backend
        result = attention(
            q, k, v, bias=bias, causal=causal, key_padding_mask=key_padding_mask,
            backend=backend, return_weights=return_weights,
        )
        y, weights = result if return_weights else (result, None)
        y = self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)
        return (y, weights) if return_weights else y
