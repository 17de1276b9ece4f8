"""posenc inside a Hugging Face transformers model: the pieces a model calls, computed by posenc.

Each piece has the signature and output of the transformers code it replaces, so a model runs
unchanged with posenc's position code swapped in (tests/test_hf_interop.py reproduces the logits of
tiny random-weight Llama, Qwen2, GPT-NeoX, Phi-3, Gemma 3, DeepSeek-V3, BLOOM and T5 models):

* :class:`HFRotaryEmbedding`: a model's ``rotary_emb``. ``forward(x, position_ids[, layer_type])``
  returns transformers' ``(cos, sin)`` in ``x``'s dtype and in the form the model's own module
  returns them (the ``R/2`` values twice, concatenated, for most models; :data:`COS_SIN_FORMS`); the
  model's own attention code applies them in its own layout. :func:`swap_rotary_embedding` puts it
  into a model after checking that it reproduces the module it replaces. Read from the model's config with
  :func:`~posenc.rope.hf_config.scaling_from_hf`, in transformers' arithmetic by default (cos/sin
  bit for bit), per layer type for Gemma-style configs, with three positions per token for
  multimodal RoPE, and with transformers' length-dependent state for ``dynamic`` and ``longrope``.
* :func:`attention_forward`: an attention function with transformers' ``AttentionInterface``
  signature, computed by :func:`posenc.attention.attention` (grouped-query attention included);
  :func:`register_attention` registers it, with transformers' boolean mask creation, under a name
  for ``model.set_attn_implementation(name)``.
* :func:`bloom_alibi_tensor` and :func:`t5_compute_bias`: BLOOM's ``build_alibi_tensor`` and T5's
  ``T5Attention.compute_bias`` from :mod:`posenc.alibi` and :func:`posenc.relative.t5.t5_bias`.

transformers is imported only inside :func:`register_attention`: posenc does not depend on it.
"""

from __future__ import annotations

import types
from typing import Optional

import torch
from torch import Tensor, nn

from posenc.alibi import alibi_slopes
from posenc.attention import attention
from posenc.relative.t5 import t5_bias
from posenc.rope.frequencies import ARITHMETICS, LENGTH_DEPENDENT, inverse_frequencies
from posenc.rope.hf_config import _text_config, as_mapping, scaling_by_layer_type
from posenc.rope.multimodal import mrope_cos_sin
from posenc.rope.rotation import rope_cos_sin


#: The forms of transformers' rotary modules' ``(cos, sin)``, ``"cat"`` (the ``R/2`` values twice,
#: concatenated; most models), ``"interleave"`` (each value twice in a row) and ``"half"`` (the
#: ``R/2`` values once).
COS_SIN_FORMS = ("cat", "interleave", "half")

#: The form of the model types whose rotary module does not return ``"cat"`` (read from their
#: modelling code in transformers 5).
COS_SIN_FORM_BY_MODEL_TYPE: dict[str, str] = {
    "cohere": "interleave", "cohere2": "interleave", "cohere2_moe": "interleave", "gpt_oss": "half",
}

#: Model types whose rotary module returns complex ``freqs_cis`` (Llama 4, DeepSeek-V2), which
#: :class:`HFRotaryEmbedding` does not produce: their configs are read by
#: :func:`~posenc.rope.hf_config.scaling_from_hf`, but the module refuses them.
COMPLEX_FREQS_MODEL_TYPES = ("deepseek_v2", "llama4", "llama4_text")


def _model_type(config) -> Optional[str]:
    """The model type of the config that states the rope (a multimodal config's text config)."""
    return _text_config(as_mapping(config)).get("model_type")


class HFRotaryEmbedding(nn.Module):
    """A transformers model's rotary embedding, computed by posenc: a drop-in ``model.rotary_emb``.

    :func:`swap_rotary_embedding` puts it into a model after checking that it reproduces the
    model's own module.

    Args:
        config: the model's config (a transformers config object or ``config.json`` as a dict).
        arithmetic: ``"transformers"`` (default: the model's own cos/sin bit for bit) or ``"exact"``
            (:data:`~posenc.rope.frequencies.ARITHMETICS`).
        form: the form of the returned cos/sin (:data:`COS_SIN_FORMS`); by default the model
            type's (:data:`COS_SIN_FORM_BY_MODEL_TYPE`, else ``"cat"``).

    ``forward(x, position_ids, layer_type=None)``: ``x`` gives the dtype and device; ``position_ids``
    is ``(B, T)`` (``(3, B, T)`` or ``(B, T)`` for multimodal RoPE); ``layer_type`` picks the rope
    of a config with one per layer type (Gemma 3 passes it). Returns ``(cos, sin)``, each
    ``(B, T, R)`` (``(B, T, R/2)`` in the ``"half"`` form) in ``x.dtype``.

    The ``dynamic`` scaling keeps transformers' state: the frequencies of the longest length seen so
    far, back to the original ones once a shorter sequence than the original length comes; LongRoPE
    uses its long factors for a call whose largest position reaches past the original length.

    Raises:
        ValueError: a config posenc cannot read (see :func:`~posenc.rope.hf_config.scaling_from_hf`),
            one without a head size, a model type with complex ``freqs_cis``, an unknown ``form``
            or ``layer_type``.
    """

    def __init__(self, config, *, arithmetic: str = "transformers", form: Optional[str] = None):
        super().__init__()
        model_type = _model_type(config)
        if model_type in COMPLEX_FREQS_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} takes complex freqs_cis from its rotary module, which HFRotaryEmbedding "
                "does not produce; read its rope with posenc.rope.scaling_from_hf and rotate with apply_rope"
            )
        form = COS_SIN_FORM_BY_MODEL_TYPE.get(model_type, "cat") if form is None else form
        if form not in COS_SIN_FORMS:
            raise ValueError(f"form must be one of {COS_SIN_FORMS}, got {form!r}")
        self.form = form
        self.ropes = {t: r for t, r in scaling_by_layer_type(config).items() if r is not None}
        for layer_type, rope in self.ropes.items():
            if rope.rotary_dim is None:
                raise ValueError(f"the config gives no head size for {layer_type!r}: pass the whole config")
        if arithmetic not in ARITHMETICS:
            raise ValueError(f"arithmetic must be one of {ARITHMETICS}, got {arithmetic!r}")
        self.arithmetic = arithmetic
        self._longest = {t: None for t in self.ropes}  # dynamic: the length whose frequencies are in use
        self._memo: dict[str, tuple] = {}  # layer type -> ((length or None, device), inv_freq, attention scale)

    def _frequencies(self, layer_type: str, seq_len: int, device: torch.device) -> tuple[Tensor, float]:
        rope = self.ropes[layer_type]
        rope_type = (rope.scaling or {}).get("rope_type", "default")
        if rope_type == "dynamic":  # transformers' dynamic_rope_update: grow with the longest length, reset below L
            original = rope.scaling["original_max_position_embeddings"]
            longest = self._longest[layer_type] or original
            if seq_len > longest:
                longest = seq_len
            elif seq_len < original:
                longest = original
            self._longest[layer_type] = longest
            seq_len = longest
        elif rope_type == "longrope":  # two sets of frequencies: up to the original length, and past it
            original = rope.scaling["original_max_position_embeddings"]
            seq_len = original + 1 if seq_len > original else original
        else:
            seq_len = None
        key = (seq_len, device)
        memo = self._memo.get(layer_type)
        if memo is None or memo[0] != key:  # the last frequencies of each layer type are kept
            inv_freq, scale = inverse_frequencies(rope.rotary_dim, rope.base, rope.scaling, seq_len=seq_len,
                                                  arithmetic=self.arithmetic)
            memo = self._memo[layer_type] = (key, inv_freq.to(device), scale)
        return memo[1], memo[2]

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: Optional[str] = None) -> tuple[Tensor, Tensor]:
        if layer_type is None:
            first = next(iter(self.ropes.values()))
            if any(rope != first for rope in self.ropes.values()):
                raise ValueError(f"the config has a rope per layer type ({sorted(self.ropes)}): pass layer_type")
            layer_type = next(iter(self.ropes))
        if layer_type not in self.ropes:
            raise ValueError(f"layer_type must be one of {sorted(self.ropes)}, got {layer_type!r}")
        rope = self.ropes[layer_type]
        seq_len = int(position_ids.max()) + 1
        inv_freq, scale = self._frequencies(layer_type, seq_len, x.device)
        if rope.mrope is not None:
            positions = position_ids if position_ids.dim() == 3 else position_ids.expand(3, *position_ids.shape)
            cos, sin = mrope_cos_sin(positions.to(x.device), inv_freq, **rope.mrope,
                                     attention_scale=scale, arithmetic=self.arithmetic)
        else:
            cos, sin = rope_cos_sin(position_ids.to(x.device), inv_freq, scale, arithmetic=self.arithmetic)
        if self.form == "cat":
            cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # (B, T, R) each
        elif self.form == "interleave":
            cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)  # (B, T, R) each
        return cos.to(x.dtype), sin.to(x.dtype)


def swap_rotary_embedding(model: nn.Module, *, arithmetic: str = "transformers", positions: int = 64) -> int:
    """Replace every ``rotary_emb`` module of a transformers model by :class:`HFRotaryEmbedding`,
    after checking that it reproduces the module it replaces.

    The check runs both modules at positions ``0 .. positions - 1`` (within the original length, so
    that no length-dependent state moves), for every layer type a module takes: equal bit for bit
    in transformers' arithmetic, to ``1e-5`` in the exact one. Returns how many were replaced. Swap
    before the model's first forward: a dynamic-NTK module that has already run past its original
    length keeps the frequencies of that length, which a fresh module does not reproduce (refused).

    Raises:
        ValueError: a module that posenc's does not reproduce (a cos/sin form or a config it does not
            know), naming it and the difference; nothing is replaced then.
    """
    import inspect

    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if name == "rotary_emb"]
    swaps = []
    for parent, name, original in found:
        ours = HFRotaryEmbedding(text, arithmetic=arithmetic)
        x = torch.zeros(1, dtype=torch.float32, device=next(original.buffers(), torch.zeros(1)).device)
        ids = torch.arange(min(positions, getattr(text, "max_position_embeddings", positions)), device=x.device)[None]
        takes_type = "layer_type" in inspect.signature(original.forward).parameters
        for layer_type in (list(ours.ropes) if takes_type else [None]):
            with torch.no_grad():
                theirs = original(x, ids, layer_type) if takes_type else original(x, ids)
                mine = ours(x, ids, layer_type)
            gap = max((a.float() - b.float()).abs().max().item() if a.shape == b.shape else float("inf")
                      for a, b in zip(mine, theirs))
            if gap > (0.0 if arithmetic == "transformers" else 1e-5):
                raise ValueError(
                    f"posenc's HFRotaryEmbedding does not reproduce {type(original).__name__}"
                    + (f" for layer type {layer_type!r}" if layer_type else "")
                    + f" (largest difference {gap:.3g}; shapes {tuple(mine[0].shape)} and {tuple(theirs[0].shape)}): "
                    "its cos/sin form or its config is one posenc does not know; nothing was replaced"
                )
        swaps.append((parent, name, ours.to(x.device)))
    for parent, name, ours in swaps:
        setattr(parent, name, ours)
    return len(swaps)


def attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    is_causal: Optional[bool] = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers' attention-function interface, computed by :func:`posenc.attention.attention`.

    Args:
        module: the calling attention module (its ``is_causal`` is read when no mask is given).
        query: ``(B, H, T, D)``; key, value: ``(B, H_kv, S, D)`` and ``(B, H_kv, S, Dv)``.
        attention_mask: ``None`` (causal, or nothing to mask), transformers' boolean
            ``(B, 1, T, S)`` mask (True = attend; :func:`register_attention` asks for it), or an
            additive float mask.
        scaling: the logit scale (default ``1/sqrt(D)``).
        dropout: must be 0 (posenc's attention has no dropout; transformers passes 0 in eval mode).
        is_causal: overrides ``module.is_causal``.
        kwargs: transformers' other keyword arguments; a ``softcap`` or ``position_bias`` is refused.

    Returns:
        ``(out, None)``, ``out`` of shape ``(B, T, H, Dv)`` as transformers expects.

    Raises:
        ValueError: dropout, logit soft-capping or a position bias (not computed here).
    """
    if dropout:
        raise ValueError(f"posenc's attention has no dropout; got dropout={dropout} (use the model in eval mode)")
    for name in ("softcap", "position_bias", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"posenc's attention_forward does not compute {name}; use transformers' own attention")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    bias = None
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # True = attend; the lowest finite logit, as transformers' eager masks
            bias = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
            bias = bias.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
        else:
            bias = attention_mask.to(query.dtype)
        causal = False  # the mask already holds the causal pattern (and any sliding window)
    causal = causal and query.shape[2] > 1
    out = attention(query, key, value, bias=bias, causal=causal, scale=scaling, backend="sdpa")
    return out.transpose(1, 2).contiguous(), None


def register_attention(name: str = "posenc") -> str:
    """Register :func:`attention_forward` with transformers under ``name``, with its boolean
    ``sdpa`` masks; then ``model.set_attn_implementation(name)``. Returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def bloom_alibi_tensor(attention_mask: Tensor, num_heads: int, dtype: torch.dtype) -> Tensor:
    """BLOOM's ``build_alibi_tensor``: ALiBi's bias of every key, ``(B * H, 1, S)``, from posenc.

    The bias of key ``s`` in head ``h`` is ``m_h * p_s``, ``p_s`` the key's position counted over
    the kept tokens (0 at the first one; 0 at padding). BLOOM adds it to every query's row: the
    query's own term ``-m_h * p_t`` is the same across a row, so softmax removes it.

    Args:
        attention_mask: ``(B, S)`` 0/1, 1 = keep (transformers' form).
        num_heads: ``H``.
        dtype: of the result.
    """
    B, S = attention_mask.shape
    slopes = alibi_slopes(num_heads, arithmetic="transformers").to(attention_mask.device)  # (H,): BLOOM's bits
    keep = attention_mask.to(torch.long)
    positions = ((keep.cumsum(-1) - 1) * keep).to(torch.float32)  # (B, S)
    return (slopes[None, :, None] * positions[:, None, :]).reshape(B * num_heads, 1, S).to(dtype)


def t5_compute_bias(module: nn.Module, query_length: int, key_length: int, device=None, past_seen_tokens: int = 0) -> Tensor:
    """``T5Attention.compute_bias`` from :func:`posenc.relative.t5.t5_bias`: ``(1, H, T, S)``.

    Bind it to a T5 attention module that has the table (``has_relative_attention_bias``) with
    ``module.compute_bias = types.MethodType(t5_compute_bias, module)``, or use
    :func:`use_posenc_t5_bias` on a whole model.
    """
    weight = module.relative_attention_bias.weight  # (num_buckets, H)
    device = weight.device if device is None else device
    queries = torch.arange(query_length, device=device) + past_seen_tokens
    keys = torch.arange(key_length, device=device)
    bias = t5_bias(weight, queries, keys, bidirectional=not module.is_decoder,
                   max_distance=module.relative_attention_max_distance)
    return bias.unsqueeze(0)  # (1, H, T, S)


def use_posenc_t5_bias(model: nn.Module) -> int:
    """Make every T5 attention module with a bias table compute it with :func:`t5_compute_bias`;
    returns how many were changed.

    Raises:
        ValueError: a module whose ``compute_bias`` is not T5's ``(query_length, key_length, ...)``
            (LongT5's local and transient-global attention take a block length); nothing is changed.
    """
    import inspect

    modules = [m for m in model.modules() if getattr(m, "has_relative_attention_bias", False)]
    for module in modules:
        params = list(inspect.signature(module.compute_bias).parameters)
        if params[:2] != ["query_length", "key_length"]:
            raise ValueError(
                f"{type(module).__name__}.compute_bias takes {params}, not T5's (query_length, key_length, ...): "
                "posenc's T5 bias does not replace it; nothing was changed"
            )
    for module in modules:
        module.compute_bias = types.MethodType(t5_compute_bias, module)
    return len(modules)
