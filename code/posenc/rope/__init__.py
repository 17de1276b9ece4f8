"""Rotary position embedding (RoPE): rotate each pair of query/key dimensions by an angle ∝ position.

Su et al. 2021 (RoFormer), arXiv:2104.09864, eqs. (13)-(16) and (34). The pairs ``(x_a, x_b)`` of a
head of size ``D`` are rotated by ``m θ_i`` at position ``m``, with ``θ_i = base^(-2i/D)``,
``i = 0 .. D/2 - 1``::

    (x_a, x_b) -> (x_a cos mθ_i - x_b sin mθ_i,  x_b cos mθ_i + x_a sin mθ_i)

so that ``<R_m q, R_n k> = <q, R_{n-m} k>`` depends on the positions only through ``n - m``
(relative position = key - query). Which dimensions form a pair is the **layout**:

* ``layout="half"``: dimension ``i`` pairs with ``i + D/2`` (GPT-NeoX; Hugging Face Llama, Qwen,
  Mistral, Gemma, ... checkpoints and their ``rotate_half``);
* ``layout="interleaved"``: dimension ``2i`` pairs with ``2i + 1`` (the RoFormer paper, GPT-J,
  Meta's reference Llama code, which multiplies complex numbers).

The two are the same method up to a fixed permutation of the head dimensions
(:func:`layout_permutation`); a checkpoint trained in one layout runs in the other once its query
and key projection rows are permuted (:func:`permute_qk_weight`).

Partial rotary (GPT-NeoX, GPT-J, Phi): only the first ``R = rotary_dim`` dimensions of each head
are rotated, the rest pass through. In :func:`apply_rope` it is implied by the width of
``cos``/``sin``: ``R = 2 * cos.shape[-1]``.

Numerics: inverse frequencies are computed in fp32 exactly as the reference implementations do
(``1 / base ** (arange(0, R, 2) / R)``), so that they are bit-identical to those the checkpoints
were trained with. Angles are computed in fp32 for positions below :data:`~posenc.rope.rotation.FP64_ANGLES_FROM` (bit
identical to Hugging Face there) and in fp64 from that position on, where an fp32 angle has an
absolute error of up to ``position * 2**-24`` radians; the decision is per position, so a
position's cos/sin never depend on which other positions are in the same call. cos/sin are
returned in fp32 and the rotation is computed in fp32 whatever the dtype of ``x``, rounding once
at the end.

The package has six modules; it re-exports the public names of the first four:

==============================  ====================================================================
module                          what
==============================  ====================================================================
:mod:`.frequencies`             ``θ_i`` and the table of scalings that stretch them to longer
                                contexts (linear, NTK-aware, dynamic NTK, YaRN, Llama 3, LongRoPE,
                                proportional):
                                :func:`inverse_frequencies`, :data:`~posenc.rope.frequencies.ROPE_SCALINGS`
:mod:`.hf_config`               :func:`scaling_from_hf`: the base, scaling and rotated dims of a
                                Hugging Face checkpoint's ``config.json`` (per layer type:
                                :func:`scaling_by_layer_type`)
:mod:`.rotation`                cos/sin (:func:`rope_cos_sin`), the rotation (:func:`apply_rope`),
                                layouts, axial 2-D RoPE, the :class:`RotaryEmbedding` method
:mod:`.multimodal`              multimodal RoPE (Qwen2-VL's M-RoPE): :func:`mrope_cos_sin`
:mod:`.kernel`                  the rotation as one Triton kernel on CUDA, bit-identical to the
                                eager one (:func:`~posenc.rope.kernel.rope_kernel`)
:mod:`.packed`                  the interleaved rotation with each pair read as one word,
                                bit-identical to the eager one: :func:`apply_rope`'s compiled CPU
                                path for that layout (:func:`~posenc.rope.packed.rotate_words`)
==============================  ====================================================================
"""

from posenc.rope.frequencies import (
    ARITHMETICS,
    LENGTH_DEPENDENT,
    ROPE_SCALINGS,
    default_inv_freq,
    dynamic_inv_freq,
    inverse_frequencies,
    linear_inv_freq,
    llama3_inv_freq,
    longrope_inv_freq,
    ntk_aware_inv_freq,
    proportional_inv_freq,
    wavelengths,
    yarn_inv_freq,
    yarn_mscale,
)
from posenc.rope.hf_config import HF_ROPE_KEYS, HFRope, scaling_by_layer_type, scaling_from_hf
from posenc.rope.multimodal import mrope_axes, mrope_cos_sin
from posenc.rope.rotation import (
    APPLY_BACKENDS,
    COMPILE_MIN_NUMEL,
    FP64_ANGLES_FROM,
    LAYOUTS,
    RotaryEmbedding,
    apply_rope,
    apply_rope_eager,
    axial_rope_cos_sin,
    layout_permutation,
    permute_qk_weight,
    rope_cos_sin,
)

__all__ = [
    "APPLY_BACKENDS",
    "ARITHMETICS",
    "COMPILE_MIN_NUMEL",
    "FP64_ANGLES_FROM",
    "HFRope",
    "HF_ROPE_KEYS",
    "LAYOUTS",
    "LENGTH_DEPENDENT",
    "ROPE_SCALINGS",
    "RotaryEmbedding",
    "apply_rope",
    "apply_rope_eager",
    "axial_rope_cos_sin",
    "default_inv_freq",
    "dynamic_inv_freq",
    "inverse_frequencies",
    "layout_permutation",
    "linear_inv_freq",
    "llama3_inv_freq",
    "longrope_inv_freq",
    "mrope_axes",
    "mrope_cos_sin",
    "ntk_aware_inv_freq",
    "permute_qk_weight",
    "proportional_inv_freq",
    "rope_cos_sin",
    "scaling_by_layer_type",
    "scaling_from_hf",
    "wavelengths",
    "yarn_inv_freq",
    "yarn_mscale",
]
