"""Scaled dot-product attention with the hooks through which position enters.

:func:`attention` is the pure computation (Vaswani et al. 2017, arXiv:1706.03762, eq. 1) with an
optional additive logit bias, a causal mask and a key-padding mask, in three interchangeable
backends that give the same numbers:

* ``"reference"``: explicit matmul + softmax in at least fp32; can return the weights. For tests.
* ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` with the bias materialised as a
  ``(B or 1, H, T, S)`` tensor. The simple default for short sequences.
* ``"flex"``: ``torch.nn.attention.flex_attention`` (compiled). A bias that depends only on
  ``(batch, head, query index, key index)`` is given as a function ``bias_fn`` and evaluated
  inside the kernel, so no ``T x S`` tensor is ever built; causal and padding masks become a block
  mask whose size is ``O(T S / 128²)``. A single query (a decoding step) goes to ``"sdpa"``: its
  bias is one row of ``S``, and flex would compile once per key length. Where flex cannot run (no
  backward on the CPU, head dims below 32 on the CPU, a platform without it, a failed compile, its
  recompile limit) it falls back to ``"sdpa"`` with a ``RuntimeWarning`` that says why.

A bias function has the signature ``bias_fn(b, h, q_idx, kv_idx) -> bias`` with integer tensor
arguments (FlexAttention's ``score_mod`` without the score); it must be written with indexing and
elementwise tensor operations so that it works both on scalars inside the kernel and on
broadcast index grids (:func:`materialize_bias`). :class:`SelfAttention` is the multi-head layer
of the tiny LM; it asks a :class:`~posenc.method.PositionMethod` for the query/key transform, the
logit bias (as a tensor or as a function) and, for methods that have one, a value term.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.method import PositionMethod, check_positions

BACKENDS = ("reference", "sdpa", "flex")

#: An additive logit bias as a function of indices, ``bias_fn(b, h, q_idx, kv_idx) -> bias``.
BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

#: How many compiled variants (shapes, dtypes, bias functions) a compiled kernel of posenc may have
#: before a new one falls back, with a warning, to an uncompiled path (torch's default is 8).
RECOMPILE_LIMIT = 64

#: Tile size of FlexAttention's block mask (its default ``BLOCK_SIZE``).
FLEX_BLOCK = 128

#: Smallest head dim for which the flex backend runs on the CPU; smaller heads fall back to SDPA
#: (torch 2.13's CPU kernel returned wrong values, even NaN, for D = 16 at lengths such as 8, 24, 40).
FLEX_CPU_MIN_HEAD_DIM = 32


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
    if q.shape[0] != k.shape[0] or k.shape[:2] != v.shape[:2] or q.shape[1] % k.shape[1]:
        raise ValueError(
            "q, k, v must agree on B, and k and v on H, which divides q's H (grouped-query attention); "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
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
                "pass a Hugging Face attention_mask (1 = keep) as attention_mask= instead"
            )
        if tuple(key_padding_mask.shape) != (B, S):
            raise ValueError(f"key_padding_mask must have shape (B, S) = {(B, S)}, got {tuple(key_padding_mask.shape)}")
        _check_some_key_kept(key_padding_mask)


def _check_some_key_kept(key_padding_mask: Tensor) -> None:
    """Refuse a padding mask that removes every key of a sequence: the mark of a mask of the opposite
    polarity (Hugging Face's ``attention_mask.bool()``, True = keep), which would otherwise attend
    to the padding alone. Skipped while torch.compile traces (it reads the mask on the host)."""
    if torch.compiler.is_compiling() or key_padding_mask.numel() == 0:
        return
    rows = key_padding_mask.all(dim=-1)  # (B,)
    if bool(rows.any()):
        bad = rows.nonzero().flatten().tolist()
        raise ValueError(
            f"key_padding_mask removes every key of batch rows {bad[:8]}{' ...' if len(bad) > 8 else ''}: True means "
            "padding (ignored), and a sequence needs at least one key. A Hugging Face attention_mask (1 = keep) "
            "goes in attention_mask=, or converts as key_padding_mask = attention_mask == 0"
        )


def padding_mask_from_hf(attention_mask: Tensor, name: str = "attention_mask") -> Tensor:
    """posenc's ``key_padding_mask`` (True = padding) from Hugging Face's 2-D ``attention_mask``.

    Hugging Face tokenizers return ``attention_mask`` of shape ``(B, S)`` with 1 at the tokens to
    keep and 0 at padding: the opposite polarity of ``key_padding_mask``. This is the one place the
    two meet, so that neither can be passed for the other silently.

    Args:
        attention_mask: ``(B, S)`` integer, bool or float tensor of zeros and ones, 1/True = keep.
        name: the argument's name in error messages.

    Returns:
        ``(B, S)`` bool, True at padding.

    Raises:
        TypeError: a non-tensor.
        ValueError: a tensor that is not 2-D (a 4-D additive mask is a ``bias``), values other
            than 0 and 1, or a row that keeps no key.
    """
    if not isinstance(attention_mask, Tensor) or attention_mask.is_complex():
        raise TypeError(f"{name} must be a (B, S) tensor of 0/1 (1 = keep), got {type(attention_mask).__name__}")
    if attention_mask.dim() != 2:
        raise ValueError(
            f"{name} must be Hugging Face's 2-D (B, S) mask of 0/1 (1 = keep), got shape {tuple(attention_mask.shape)}; "
            "a 4-D additive mask (0 / -inf) is a bias: pass it as bias="
        )
    if attention_mask.dtype != torch.bool and not torch.compiler.is_compiling():
        if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise ValueError(f"{name} must hold only 0 and 1 (1 = keep); an additive mask (0 / -inf) is a bias: pass it as bias=")
    padding = attention_mask == 0  # (B, S)
    if not torch.compiler.is_compiling() and bool(padding.all(dim=-1).any()):
        raise ValueError(f"{name} keeps no key in some batch row (all zeros); every sequence needs at least one key")
    return padding


def materialize_bias(bias_fn: BiasFn, B: int, H: int, T: int, S: int, device=None) -> Tensor:
    """Evaluate a bias function on broadcast index grids: the tensor the flex backend never builds.

    Args:
        bias_fn: ``bias_fn(b, h, q_idx, kv_idx) -> bias`` (see the module docstring).
        B, H, T, S: grid sizes; the index arguments have shapes ``(B, 1, 1, 1)``, ``(1, H, 1, 1)``,
            ``(1, 1, T, 1)`` and ``(1, 1, 1, S)``.
        device: device of the index grids.

    Returns:
        A float tensor broadcastable to ``(B, H, T, S)`` (dimensions the function ignores stay 1).

    Raises:
        TypeError: if ``bias_fn`` is not callable or does not return a floating-point tensor.
        ValueError: if its result does not broadcast to ``(B, H, T, S)``.
    """
    if not callable(bias_fn):
        raise TypeError(f"bias_fn must be callable as bias_fn(b, h, q_idx, kv_idx), got {type(bias_fn).__name__}")
    idx = lambda n, dim: torch.arange(n, device=device).view([n if i == dim else 1 for i in range(4)])  # noqa: E731
    bias = bias_fn(idx(B, 0), idx(H, 1), idx(T, 2), idx(S, 3))
    if not isinstance(bias, Tensor) or not bias.dtype.is_floating_point:
        raise TypeError(f"bias_fn must return a floating-point tensor, got {getattr(bias, 'dtype', type(bias).__name__)}")
    try:
        ok = torch.broadcast_shapes(bias.shape, (B, H, T, S)) == (B, H, T, S)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"bias_fn returned shape {tuple(bias.shape)}, which does not broadcast to (B, H, T, S) = {(B, H, T, S)}")
    return bias


_compiled_flex_attention = None  # torch.compile(flex_attention), built on the first call of the flex backend


def _flex_kernel():
    global _compiled_flex_attention
    if _compiled_flex_attention is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)  # dynamic shapes fail to build on the CPU
    return _compiled_flex_attention


def flex_block_mask(B: int, T: int, S: int, *, causal: bool, key_padding_mask: Optional[Tensor] = None, device=None):
    """FlexAttention ``BlockMask`` for a bottom-right causal mask and/or key padding, in ``O(T S / 128²)`` memory.

    The block structure of the causal mask is computed directly (``create_block_mask`` would
    evaluate the mask on the full ``T x S`` grid). Tiles wholly below the diagonal are "full"
    (no mask evaluated inside them) unless there is padding; tiles crossing the diagonal or holding
    padding apply the element mask; tiles above the diagonal are skipped.

    Args:
        B: batch size.
        T, S: query and key lengths (queries are the last ``T`` of ``S`` keys, as in :func:`causal_mask`).
        causal: apply the causal mask.
        key_padding_mask: optional ``(B, S)`` bool, ``True`` at padding keys.
        device: device of the block mask.

    Returns:
        A ``torch.nn.attention.flex_attention.BlockMask``, or ``None`` when nothing is masked.
    """
    from torch.nn.attention.flex_attention import BlockMask

    if not causal and key_padding_mask is None:
        return None
    n = FLEX_BLOCK
    offset = S - T
    pad = key_padding_mask

    if causal and pad is not None:
        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx + offset) & ~pad[b, kv_idx]
    elif causal:
        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + offset
    else:
        def mask_mod(b, h, q_idx, kv_idx):
            return ~pad[b, kv_idx]

    nq, nk = -(-T // n), -(-S // n)
    qb = torch.arange(nq, device=device)
    if causal:
        last_visible = torch.clamp((qb + 1) * n, max=T) - 1 + offset  # last key seen by the tile's last query
        n_visible = torch.clamp(torch.div(last_visible, n, rounding_mode="floor") + 1, max=nk)
        first_row_reach = qb * n + offset  # last key seen by the tile's first query
        n_full = torch.clamp(torch.div(first_row_reach + 1, n, rounding_mode="floor"), min=0, max=S // n)
        n_full = torch.where((qb + 1) * n <= T, n_full, torch.zeros_like(n_full))
    else:
        n_visible = torch.full((nq,), nk, device=device)
        n_full = torch.zeros_like(n_visible)
    if pad is not None:
        n_full = torch.zeros_like(n_full)
    cols = torch.arange(nk, device=device)
    partial_idx = torch.clamp(n_full[:, None] + cols[None, :], max=nk - 1)  # (nq, nk)
    full_idx = cols.expand(nq, nk)
    as_mask = lambda x: x.to(torch.int32).contiguous()[None, None]  # noqa: E731  (1, 1, nq, ...)
    return BlockMask.from_kv_blocks(
        as_mask(n_visible - n_full), as_mask(partial_idx),
        as_mask(n_full), as_mask(full_idx),
        BLOCK_SIZE=n, mask_mod=mask_mod, seq_lengths=(T, S),
    )


def _flex_unavailable_reason(q: Tensor, k: Tensor, v: Tensor) -> Optional[str]:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError as err:  # older torch
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention ({err})"
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return f"FlexAttention has no backward on the CPU in torch {torch.__version__}; use it under torch.no_grad() or on a GPU"
    if q.device.type == "cpu" and min(q.shape[-1], v.shape[-1]) < FLEX_CPU_MIN_HEAD_DIM:
        return (
            f"head dim {q.shape[-1]} < {FLEX_CPU_MIN_HEAD_DIM}: the CPU FlexAttention kernel gave wrong results "
            f"for such small heads at some lengths in torch 2.13 (tests/test_attention.py)"
        )
    return None


def _flex_fallback_warning(reason: str) -> None:
    warnings.warn(f"attention backend 'flex' fell back to 'sdpa' with a materialised bias: {reason}", RuntimeWarning, stacklevel=3)


def _flex_attention(q, k, v, bias, bias_fn, causal, key_padding_mask, scale) -> Tensor:
    B, H, T, _ = q.shape
    S = k.shape[2]
    if bias is not None:  # a materialised bias is read inside the kernel (no copy, but O(T S) memory)
        full = bias.expand(B, H, T, S)
        bias_fn = lambda b, h, q_idx, kv_idx: full[b, h, q_idx, kv_idx]  # noqa: E731
    score_mod = None
    if bias_fn is not None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias_fn(b, h, q_idx, kv_idx)
    block_mask = flex_block_mask(B, T, S, causal=causal, key_padding_mask=key_padding_mask, device=q.device)
    out = _flex_kernel()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    return out  # (B, H, T, Dv); queries with no visible key get 0


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    bias: Optional[Tensor] = None,
    bias_fn: Optional[BiasFn] = None,
    causal: bool = False,
    key_padding_mask: Optional[Tensor] = None,
    attention_mask: Optional[Tensor] = None,
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
        k: ``(B, H_kv, S, D)`` keys; ``H_kv`` divides ``H`` (grouped-query attention: key/value head
            ``j`` serves query heads ``j * H / H_kv .. (j + 1) * H / H_kv - 1``, as in transformers'
            ``repeat_kv``).
        v: ``(B, H_kv, S, Dv)`` values.
        bias: optional float tensor broadcastable to ``(B, H, T, S)``, added to the logits.
            The ``"reference"`` backend adds it in fp32 (or fp64); ``"sdpa"`` casts it to ``q.dtype``.
        bias_fn: optional additive bias as a function ``bias_fn(b, h, q_idx, kv_idx)`` of integer
            indices (``q_idx`` in ``0..T-1``, ``kv_idx`` in ``0..S-1``). The ``"flex"`` backend
            evaluates it inside the kernel; the others materialise it with :func:`materialize_bias`
            (it must return a new tensor, not one it keeps: ``"sdpa"`` writes the masks into the
            materialised bias in place, where autograd allows). Mutually exclusive with ``bias``.
        causal: remove keys after each query; queries are the last ``T`` of the ``S`` keys
            (see :func:`causal_mask`). With ``T = S`` (or ``T = 1``), no bias and no padding,
            ``"sdpa"`` passes ``is_causal=True`` and builds no ``(T, S)`` mask.
        key_padding_mask: optional ``(B, S)`` bool, ``True`` where the key is padding. A mask that
            removes every key of a batch row is refused (it is what a mask of the opposite
            polarity looks like wherever a row has no padding; if every row has some, the two
            polarities cannot be told apart: pass a tokenizer's mask as ``attention_mask``).
        attention_mask: optional Hugging Face ``(B, S)`` mask of 0/1, ``1`` (or ``True``) where the
            key is kept, as tokenizers return it (:func:`padding_mask_from_hf`). Give one of
            ``key_padding_mask`` and ``attention_mask``.
        scale: logit scale; default ``1 / sqrt(D)``.
        backend: ``"reference"`` (explicit computation, logits and softmax in at least fp32),
            ``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention``) or ``"flex"``
            (compiled ``flex_attention``; see the module docstring for when it falls back).
        return_weights: also return the attention weights (``"reference"`` backend only).

    Returns:
        ``(B, H, T, Dv)`` output in the dtype of ``v``; with ``return_weights``, also the
        ``(B, H, T, S)`` weights (rows sum to 1, or to 0 for fully masked queries).

    Raises:
        TypeError: non-tensor or non-float inputs, mixed dtypes, a non-bool padding mask.
        ValueError: inconsistent shapes (the message names the tensors and their shapes),
            an unknown backend, ``causal`` with ``T > S``, ``return_weights`` without
            ``"reference"``, both ``bias`` and ``bias_fn``, both masks, a padding mask that removes
            every key of a row.
    """
    if attention_mask is not None:
        if key_padding_mask is not None:
            raise ValueError("give key_padding_mask (True = padding) or attention_mask (1 = keep), not both")
        key_padding_mask = padding_mask_from_hf(attention_mask)
    _validate(q, k, v, bias, key_padding_mask, causal, backend)
    if return_weights and backend != "reference":
        raise ValueError(f"return_weights=True needs backend='reference', got backend={backend!r}")
    if bias is not None and bias_fn is not None:
        raise ValueError("give the logit bias either as a tensor (bias) or as a function (bias_fn), not both")
    gqa = {}  # grouped-query attention: each key/value head serves H / H_kv query heads
    if k.shape[1] != q.shape[1]:
        if backend == "sdpa" and _SDPA_GQA:
            gqa = {"enable_gqa": True}  # SDPA reads the shared heads in place
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, S, D)
    B, H, T, D = q.shape
    S = k.shape[2]
    scale = D**-0.5 if scale is None else float(scale)
    if backend == "flex" and T == 1:  # one query (a decoding step): its bias row is S numbers, no T x S tensor
        backend = "sdpa"
    if backend == "flex":
        reason = _flex_unavailable_reason(q, k, v)
        if reason is None:
            # flex compiles once per shape (dynamic shapes fail to build on the CPU): allow many shapes, and past
            # the limit, where flex would run uncompiled (the whole T x S matrix), raise instead, warned below
            try:
                with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True, recompile_limit=RECOMPILE_LIMIT):
                    return _flex_attention(q, k, v, bias, bias_fn, causal, key_padding_mask, scale)
            except Exception as err:  # a failed compile must not pass silently: warn, then compute the same numbers
                reason = f"flex_attention raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        _flex_fallback_warning(reason)
        backend = "sdpa"
    owned = False  # may the bias be written in place? Only a tensor built here, never the caller's
    if bias_fn is not None:
        bias = materialize_bias(bias_fn, B, H, T, S, device=q.device)
        owned = True

    # Causal masking needs no (T, S) tensor when every query sees every key (T = 1: the query is the
    # last key) or when SDPA's own causal flag means the same thing (T = S; its mask is aligned
    # top-left, ours bottom-right, and the two coincide only there).
    if causal and T == 1:
        causal = False
    if backend == "sdpa" and causal and T == S and key_padding_mask is None and bias is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, **gqa)  # no mask is built
        return out  # (B, H, T, Dv)

    # Combined boolean mask, True = removed, broadcastable to (B, H, T, S).
    mask = None
    if causal:
        mask = causal_mask(T, S, device=q.device)  # (T, S)
    dead = None  # queries with no visible key: attend to everything, then zero the output
    if key_padding_mask is not None:  # without padding every query sees at least key 0 (T <= S)
        pad = key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
        mask = pad if mask is None else (mask | pad)
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

    attn_mask = None
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        owned = owned or attn_mask is not bias  # .to made a copy
    if mask is not None:
        if attn_mask is None:
            attn_mask = ~mask  # SDPA's bool convention: True = attend
        elif (owned and not attn_mask._is_view() and not (torch.is_grad_enabled() and attn_mask.requires_grad)
              and attn_mask.shape == torch.broadcast_shapes(attn_mask.shape, mask.shape)):
            attn_mask.masked_fill_(mask, float("-inf"))  # a full-size bias built here: mask it in place
        else:
            attn_mask = torch.where(mask, float("-inf"), attn_mask)  # a copy: the caller's bias stays untouched
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale, **gqa)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out  # (B, H, T, Dv)


#: Whether this torch's SDPA takes ``enable_gqa`` (2.5 and later): grouped-query attention without a copy of k and v.
_SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def check_logn_length(length, name: str = "logn_length") -> None:
    """Raise ``ValueError`` unless ``length`` is ``None`` or an int ``>= 2`` (``log L`` divides)."""
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 2):
        raise ValueError(f"{name} must be None (off) or an int >= 2 (the training length L), got {length!r}")


def logn_query_scale(positions: Tensor, length: int) -> Tensor:
    """Log-n attention scaling: the factor ``max(1, log(n + 1) / log(L))`` of the query at position ``n``.

    Source 004 §4.2(5) ("adding log n to concentrate attention helps"). Su (2021, "Attention's scale
    from entropy invariance", kexue.fm/archives/8823) keeps the entropy of the attention weights
    from growing with the number of keys ``m`` by *multiplying* the logits by ``log m / log L``,
    ``L`` the training length, which sharpens the softmax on long inputs (the source's gloss says
    "divide", which would flatten it); Qwen (``use_logn_attn``) applies it to the query, with
    ``m = n + 1`` (a causal query at position ``n`` sees ``n + 1`` keys) and only past the training
    length: this function. It is the identity for ``n + 1 <= L``, so a model trained on windows of at
    most ``L`` tokens is trained the same with or without it. Chiang & Cholak (2022,
    arXiv:2202.12172) scale the logits by the log of the sequence length at every length, in training
    too: a different variant, not this one.

    Args:
        positions: ``(T,)`` integer positions ``n`` of the queries.
        length: ``L``, the training length; ``>= 2``.

    Returns:
        ``(T,)`` float32 factors, exactly 1.0 where ``n + 1 <= L``.

    Raises:
        TypeError: if ``positions`` is not an integer tensor.
        ValueError: if ``positions`` is not 1-D or negative, or ``length`` is not an int ``>= 2``.
    """
    check_positions(positions)
    check_logn_length(length, "length")
    count = (positions + 1).to(torch.float64)  # (T,) keys seen by each query
    return torch.clamp(torch.log(count) / math.log(length), min=1.0).float()  # (T,)


class SelfAttention(nn.Module):
    """Multi-head self-attention whose position handling is delegated to a position method.

    Holds the query/key/value and output projections; position enters through
    ``method.transform_qk``, ``method.attention_bias`` (or ``method.attention_bias_fn`` on the
    flex backend) and ``method.value_term`` in :meth:`forward`.

    Args:
        d_model: model width ``C``.
        n_head: number of heads ``H``; must divide ``d_model``.
        bias: whether the projections have biases.
        backend: ``"sdpa"`` (default), ``"reference"`` or ``"flex"``, passed to :func:`attention`.
            Methods with a value term (``method.needs_attention_weights``) always use ``"reference"``.
        logn_length: ``None`` (off), or the training length ``L`` of log-n scaling: after the
            method's ``transform_qk``, the query at position ``n`` is multiplied by
            :func:`logn_query_scale` (``max(1, log(n + 1) / log L)``), so every logit term linear
            in the query is scaled (content-content, and the content-position terms of
            Transformer-XL, DeBERTa and TUPE); a bias that does not depend on the query (ALiBi, T5)
            is not.

    Raises:
        ValueError: if ``n_head`` does not divide ``d_model``, the backend is unknown or
            ``logn_length`` is neither ``None`` nor an int ``>= 2``.
    """

    def __init__(self, d_model: int, n_head: int, *, bias: bool = False, backend: str = "sdpa",
                 logn_length: Optional[int] = None):
        super().__init__()
        if n_head < 1 or d_model % n_head != 0:
            raise ValueError(f"n_head must be a positive divisor of d_model={d_model}, got n_head={n_head}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        check_logn_length(logn_length)
        self.logn_length = logn_length
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
        attention_mask: Optional[Tensor] = None,
        return_weights: bool = False,
        cache=None,
        key_positions: Optional[Tensor] = None,
    ) -> Union[Tensor, tuple[Tensor, Tensor]]:
        """Attend from every token to the (earlier, if ``causal``) tokens of ``x``.

        Args:
            x: ``(B, T, C)`` inputs.
            positions: ``(T,)`` integer positions of the tokens, or per batch row ``(B, T)`` for a
                method with ``per_row_positions`` (RoPE, ALiBi, T5).
            method: the position method supplying ``transform_qk`` and ``attention_bias``.
            layer: index of this layer, passed to the method's hooks.
            causal: apply the causal mask.
            key_padding_mask: optional ``(B, S)`` bool, ``True`` at padding keys (``S = T`` without
                a cache).
            attention_mask: optional Hugging Face ``(B, S)`` 0/1 mask, ``1`` at kept keys; instead of
                ``key_padding_mask`` (see :func:`attention`).
            return_weights: also return ``(B, H, T, S)`` attention weights (uses the reference backend).
            cache: optional :class:`posenc.kv_cache.KVCache`; the new keys/values (after
                ``transform_qk``) are stored in slot ``layer`` and the queries attend to every
                cached key. Needs ``key_positions``.
            key_positions: ``(S,)`` (or ``(B, S)``) positions of all keys when ``cache`` is given
                (:meth:`~posenc.kv_cache.KVCache.reserve`).

        Returns:
            ``(B, T, C)`` outputs, and the weights if requested.
        """
        if x.dim() != 3:
            raise ValueError(f"x must have shape (B, T, C), got {tuple(x.shape)}")
        B, T, C = x.shape
        if isinstance(positions, Tensor) and positions.dim() == 2 and not method.per_row_positions:
            raise ValueError(
                f"{type(method).__name__} takes positions (T,), not one row per sequence {tuple(positions.shape)}; "
                "methods with per_row_positions (RoPE, ALiBi, T5) take (B, T)"
            )
        check_positions(positions, per_row=method.per_row_positions)
        if positions.shape[-1] != T or (positions.dim() == 2 and positions.shape[0] != B):
            raise ValueError(f"positions of shape {tuple(positions.shape)} do not match x's (B, T) = {(B, T)}")
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (z.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D)
        q, k = method.transform_qk(q, k, positions, positions, layer)
        if self.logn_length is not None:
            scale = logn_query_scale(positions.reshape(-1), self.logn_length).view(positions.shape)  # (T,) or (B, T)
            q = q * (scale[:, None] if scale.dim() == 1 else scale[:, None, :, None]).to(q.dtype)  # (B, H, T, D)
        k_positions = positions
        if cache is not None:  # keys are stored after the transform: never transformed again
            if key_positions is None:
                raise ValueError("key_positions (the positions of all cached keys) is required with a cache")
            k, v = cache.update(layer, k, v)  # (B, H, S, D)
            k_positions = key_positions
        # A value term needs the attention weights, which only the reference backend returns.
        want_weights = return_weights or method.needs_attention_weights
        backend = "reference" if want_weights else self.backend
        bias_fn = method.attention_bias_fn(q, k, positions, k_positions, layer) if backend == "flex" else None
        bias = method.attention_bias(q, k, positions, k_positions, layer) if bias_fn is None else None
        if bias is not None and bias.dim() == 4 and bias.shape[1] not in (1, self.n_head):
            raise ValueError(
                f"{type(method).__name__} gives a bias for {bias.shape[1]} heads but this layer has n_head={self.n_head}; "
                "build the method with num_heads equal to the layer's"
            )
        result = attention(
            q, k, v, bias=bias, bias_fn=bias_fn, causal=causal, key_padding_mask=key_padding_mask,
            attention_mask=attention_mask,
            backend=backend, return_weights=want_weights,
        )
        y, weights = result if want_weights else (result, None)
        if method.needs_attention_weights:
            y = y + method.value_term(weights, positions, k_positions, layer).to(y.dtype)  # (B, H, T, D)
        y = self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)
        return (y, weights) if return_weights else y
