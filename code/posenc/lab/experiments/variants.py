"""One trained model evaluated under another position configuration: log-n scaling, RoPE scalings.

Extending a model's context without retraining changes how position is computed, not the weights:
:func:`rope_variant` swaps a model's rotary embedding for one with a scaling of
:data:`~posenc.rope.frequencies.ROPE_SCALINGS` (position interpolation, NTK-aware, dynamic NTK, YaRN, Llama 3),
:func:`variant` switches on log-n attention scaling (:func:`posenc.attention.logn_query_scale`) or
puts in any other position method. Each returns a copy with the same weights on the same device,
so the trained model is never modified; :func:`scaling_config` builds the scalings as the
extrapolation study uses them (:mod:`posenc.lab.experiments.extrapolation`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Optional

from posenc.lab.lm import TinyLM
from posenc.method import PositionMethod
from posenc.rope import RotaryEmbedding

#: The RoPE scalings :func:`scaling_config` builds (``"longrope"`` needs searched per-pair factors).
SCALINGS = ("linear", "ntk_aware", "dynamic", "yarn", "llama3")


def scaling_config(name: str, factor: float, original_length: int) -> Optional[dict]:
    """The ``scaling`` mapping of :func:`posenc.rope.inverse_frequencies` that stretches RoPE by ``factor``.

    ``factor`` is ``s`` and ``original_length`` is ``L``, the training length. Llama 3's band is
    Llama 3.1's (``low_freq_factor = 1``, ``high_freq_factor = 4``); YaRN keeps its defaults (betas
    32 and 1; attention scale ``0.1 ln s + 1``, which multiplies cos and sin as in Hugging Face).
    ``"dynamic"`` is Hugging Face's form, whose effective factor at the current length ``n`` is
    ``s n / L - (s - 1)``: with ``s = n / L`` and the whole window evaluated at once it is
    ``s^2 - s + 1``, more than ``s``.

    Args:
        name: ``"default"`` (RoFormer's frequencies: returns ``None``) or one of :data:`SCALINGS`.
        factor: ``s >= 1``.
        original_length: ``L``.

    Returns:
        ``None`` or ``{"rope_type": name, "factor": s, ...}`` with the keys that variant takes.

    Raises:
        ValueError: for an unknown ``name``.
    """
    keys = {"linear": {}, "ntk_aware": {}, "dynamic": {"original_max_position_embeddings": original_length},
            "yarn": {"original_max_position_embeddings": original_length},
            "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": original_length}}
    if name == "default":
        return None
    if name not in keys:
        raise ValueError(f"scaling must be 'default' or one of {SCALINGS}, got {name!r}")
    return {"rope_type": name, "factor": float(factor), **keys[name]}


def variant(model: TinyLM, *, position: Optional[PositionMethod] = None, logn_length: Optional[int] = None) -> TinyLM:
    """A copy of ``model`` (same weights, same device) with another position method and/or log-n scaling.

    Args:
        model: a trained model; left untouched.
        position: the copy's position method, with the same parameters (if any) as the old one;
            ``None`` keeps a copy of the old one.
        logn_length: ``LMConfig.logn_length`` of the copy (``None``: log-n scaling off).

    Returns:
        The copy, in eval mode if ``model`` is.
    """
    config = dataclasses.replace(model.config, logn_length=logn_length)
    clone = TinyLM(config, copy.deepcopy(model.position) if position is None else position)
    clone.load_state_dict(model.state_dict())
    return clone.to(next(model.parameters()).device).train(model.training)


def rope_variant(model: TinyLM, scaling: Optional[dict], max_positions: int) -> TinyLM:
    """A copy of a RoPE model whose rotary embedding uses ``scaling``, cos/sin cached for ``max_positions``.

    The base, rotated dims and layout are the model's; a length-dependent scaling (``"dynamic"``)
    is evaluated at ``seq_len = max_positions`` (see :class:`~posenc.rope.RotaryEmbedding`). Log-n
    scaling stays as it was.

    Raises:
        TypeError: if ``model``'s position method is not a :class:`~posenc.rope.RotaryEmbedding`.
    """
    old = model.position
    if not isinstance(old, RotaryEmbedding):
        raise TypeError(f"rope_variant needs a model whose position is a RotaryEmbedding, got {type(old).__name__}")
    new = RotaryEmbedding(old.head_dim, max_positions, old.base, rotary_dim=old.rotary_dim, layout=old.layout,
                          scaling=scaling)
    return variant(model, position=new, logn_length=model.config.logn_length)
