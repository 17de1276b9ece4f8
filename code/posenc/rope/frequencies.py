"""RoPE's frequencies ``θ_i`` and the scalings that stretch them past the training length.

Every variant is one entry of :data:`~posenc.rope.frequencies.ROPE_SCALINGS` with one signature,
``(head_dim, base, config, seq_len, device) -> (inv_freq, attention_scale)``, and is reached through
:func:`inverse_frequencies` with a mapping whose ``"rope_type"`` names it. ``D`` below is the number
of rotated dimensions (the head dim, or ``rotary_dim`` for partial rotary), ``b`` the base, ``s`` the
``factor`` and ``L`` the original (pre-training) context length; pair ``i = 0 .. D/2 - 1`` has the
frequency ``θ_i = b^(-2i/D)`` and the wavelength ``λ_i = 2π/θ_i`` positions.

============  =====================================================  ================================
rope_type     frequencies                                            attention scale
============  =====================================================  ================================
default       ``θ_i`` (RoFormer)                                     1
linear        ``θ_i / s`` (position interpolation)                   1
ntk_aware     ``θ_i`` of the base ``b s^(D/(D-2))``                  1
dynamic       ntk_aware with a factor that grows with ``seq_len``    1
yarn          ``θ_i`` for short wavelengths, ``θ_i / s`` for long,   ``0.1 ln s + 1`` (or given)
              a linear ramp between
llama3        the same three bands, cut by wavelength                1
longrope      ``θ_i / a_i`` with a searched factor ``a_i`` per pair  ``sqrt(1 + ln s / ln L)``
proportional  ``θ_i / s`` for the first ``p D/2`` pairs, 0 (not      1
              rotated) for the rest
============  =====================================================  ================================

Every entry but ``ntk_aware`` is one of Hugging Face's ``rope_type`` values and gives the same
frequencies and attention scale as ``transformers.modeling_rope_utils`` for the same configuration
(to fp32 rounding); :func:`~posenc.rope.hf_config.scaling_from_hf` turns a checkpoint's
``config.json`` into the ``base`` and ``scaling`` these functions take.

Numerics: the unscaled ``θ_i`` are computed in fp32 exactly as the reference implementations do
(:func:`default_inv_freq`); a scaling is applied to them in fp64 and the result rounded once to fp32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Callable, Optional, Union

import torch
from torch import Tensor

DeviceLike = Union[torch.device, str, None]

_MISSING = object()


# --------------------------------------------------------------------------- validation


def _check_head_dim(head_dim, name: str = "head_dim") -> None:
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"{name} must be a positive even int (dimensions are rotated in pairs), got {head_dim!r}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _params(config: Mapping, rope_type: str, required: tuple, optional: Optional[dict] = None) -> dict:
    """The keys of a scaling mapping, checked against what ``rope_type`` takes; optional keys that are
    absent (or ``None``) get their defaults.

    Raises:
        ValueError: a required key missing, a key the variant does not take.
    """
    optional = optional or {}
    given = {k: v for k, v in config.items() if k not in ("rope_type", "type")}
    allowed = f"required {list(required)}" + (f", optional {optional}" if optional else "")
    for key in given:
        if key not in required and key not in optional:
            raise ValueError(
                f"scaling of rope_type {rope_type!r} does not take the key {key!r} (value {given[key]!r}); {allowed}"
            )
    for key in required:
        if given.get(key) is None:
            raise ValueError(f"scaling of rope_type {rope_type!r} needs the key {key!r}; {allowed}")
    return {**optional, **{k: v for k, v in given.items() if v is not None}}


def _real(p: dict, rope_type: str, key: str, *, minimum: float = 0.0, inclusive: bool = False) -> float:
    """``p[key]`` as a float, checked to be a finite number ``> minimum`` (``>=`` if ``inclusive``)."""
    value = p[key]
    if not _is_number(value) or value < minimum or (value == minimum and not inclusive):
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ValueError(f"{key} of a {rope_type!r} scaling must be a finite number {bound}, got {value!r}")
    return float(value)


def _factor(p: dict, rope_type: str) -> float:
    return _real(p, rope_type, "factor", minimum=1.0, inclusive=True)


def _length(p: dict, rope_type: str, minimum: int = 1) -> int:
    value = p["original_max_position_embeddings"]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(
            f"original_max_position_embeddings of a {rope_type!r} scaling must be an int >= {minimum}, got {value!r}"
        )
    return value


def _need_seq_len(seq_len: Optional[int], rope_type: str) -> int:
    if seq_len is None:
        raise ValueError(
            f"rope_type {rope_type!r} depends on the current length: pass seq_len (the largest position + 1)"
        )
    return seq_len


def _base_exponent(head_dim: int, rope_type: str) -> float:
    """``D / (D - 2)``, the exponent of the NTK-aware base change (undefined for ``D = 2``)."""
    if head_dim <= 2:
        raise ValueError(
            f"rope_type {rope_type!r} changes the base by s^(D/(D-2)) and needs head_dim > 2, got {head_dim}"
        )
    return head_dim / (head_dim - 2)


# --------------------------------------------------------------------------- the variants


def _fp32_theta(head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """``(base ** (2i / D), 1 / that)`` in fp32, as transformers computes them. ``(D/2,)`` each."""
    powers = base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    return powers, 1.0 / powers


def default_inv_freq(head_dim: int, base: float, config: Mapping, seq_len: Optional[int], device: DeviceLike):
    """RoFormer's frequencies ``θ_i = base^(-2i/D)`` and attention scale 1 (no scaling).

    Computed in fp32 on the CPU, as GPT-NeoX, Meta's Llama and Hugging Face's
    ``_compute_default_rope_parameters`` do, then moved to ``device``: the values are bit-identical
    to theirs on every device (a GPU's ``pow`` can differ from the CPU's in the last bit).

    Returns:
        ``(inv_freq, attention_scale)``: ``(D/2,)`` float32 and ``1.0``.
    """
    return _fp32_theta(head_dim, base)[1].to(device), 1.0  # (D/2,)


def _scaled(inv_freq: Tensor, divisor: Union[Tensor, float], device: DeviceLike) -> Tensor:
    """``inv_freq / divisor`` in fp64, rounded once to fp32, on ``device``. ``(D/2,)``."""
    return (inv_freq.double() / divisor).float().to(device)


def linear_inv_freq(head_dim: int, base: float, config: Mapping, seq_len: Optional[int], device: DeviceLike):
    """Position interpolation: every frequency divided by the factor, ``θ_i / s``.

    Chen et al. 2023, arXiv:2306.15595, §2.3: positions ``m`` are squeezed to ``m L / L'`` with
    ``s = L'/L``, which is the same as dividing every ``θ_i`` by ``s`` (restated as YaRN,
    arXiv:2309.00071, eqs. 10-12: ``g(m) = m/s``). Hugging Face's ``"linear"``.

    Args:
        config: ``{"rope_type": "linear", "factor": s}``, ``s >= 1``.

    Returns:
        ``(D/2,)`` float32 ``θ_i / s`` and attention scale 1.0.

    Raises:
        ValueError: missing or extra keys, ``factor < 1``.
    """
    p = _params(config, "linear", ("factor",))
    factor = _factor(p, "linear")
    inv_freq, _ = default_inv_freq(head_dim, base, {}, None, "cpu")
    return _scaled(inv_freq, factor, device), 1.0


def ntk_aware_inv_freq(head_dim: int, base: float, config: Mapping, seq_len: Optional[int], device: DeviceLike):
    """NTK-aware scaling: RoFormer's frequencies of a larger base ``b' = b s^(D/(D-2))``.

    bloc97 2023, as defined in YaRN, arXiv:2309.00071, eqs. 14-16. The highest frequency
    (``i = 0``) is unchanged and the lowest (``i = D/2 - 1``) becomes ``θ_{D/2-1} / s``: high
    frequencies are extrapolated, low ones interpolated, with no length to choose. Not a Hugging Face
    ``rope_type`` (there it is the static form of ``"dynamic"``).

    Args:
        config: ``{"rope_type": "ntk_aware", "factor": s}``, ``s >= 1``.

    Returns:
        ``(D/2,)`` float32 ``b'^(-2i/D)`` and attention scale 1.0.

    Raises:
        ValueError: missing or extra keys, ``factor < 1``, ``D = 2``.
    """
    p = _params(config, "ntk_aware", ("factor",))
    factor = _factor(p, "ntk_aware")
    return default_inv_freq(head_dim, base * factor ** _base_exponent(head_dim, "ntk_aware"), {}, None, device)


def dynamic_inv_freq(head_dim: int, base: float, config: Mapping, seq_len: Optional[int], device: DeviceLike):
    """Dynamic NTK: NTK-aware frequencies whose factor follows the current length ``n = seq_len``.

    YaRN, arXiv:2309.00071, §3.3 (emozilla 2023). Up to the original length ``L`` the frequencies are
    RoFormer's, bit for bit; past it the base is ``b (s n / L - (s - 1))^(D/(D-2))``, the
    convention of Hugging Face's ``"dynamic"`` (the paper's §3.3 writes the effective factor as
    ``n / L``, which is this formula with ``s = 1``). The effective factor is 1 at ``n = L`` and grows
    with slope ``s / L``.

    A KV cache does not mix with this scaling: keys are cached after rotation, so keys cached while
    the length was ``<= L`` were rotated with RoFormer's frequencies, and once the length passes ``L``
    the new queries are rotated with other frequencies: the scores of the cached keys then differ from
    those a full recomputation gives (every key rotated with the current frequencies), which
    tests/test_rope_scaling.py shows. The paper's remedy (§3.3) is to cache keys before rotation and
    rotate them all again at every step. :class:`~posenc.rope.rotation.RotaryEmbedding` sidesteps it
    by evaluating the scaling once, at ``seq_len = max_positions``.

    Args:
        config: ``{"rope_type": "dynamic", "factor": s, "original_max_position_embeddings": L}``
            (Hugging Face takes ``L`` from the config's ``max_position_embeddings``).
        seq_len: current length ``n`` (the largest position + 1); required.

    Returns:
        ``(D/2,)`` float32 frequencies and attention scale 1.0.

    Raises:
        ValueError: missing or extra keys, ``factor < 1``, a non-positive ``L``, no ``seq_len``, ``D = 2``.
    """
    p = _params(config, "dynamic", ("factor", "original_max_position_embeddings"))
    factor, L = _factor(p, "dynamic"), _length(p, "dynamic")
    n = _need_seq_len(seq_len, "dynamic")
    exponent = _base_exponent(head_dim, "dynamic")
    if n <= L:
        return default_inv_freq(head_dim, base, {}, None, device)
    return default_inv_freq(head_dim, base * (factor * n / L - (factor - 1)) ** exponent, {}, None, device)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention scale ``sqrt(1/t) = 0.1 mscale ln s + 1`` (1 for ``s <= 1``).

    YaRN, arXiv:2309.00071, eq. 22 (with ``mscale = 1``); DeepSeek-V2 (arXiv:2405.04434) weights the
    logarithm by ``mscale`` (0.707 there). It multiplies cos and sin, so the logits are scaled by its
    square.
    """
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(head_dim: int, base: float, config: Mapping, seq_len: Optional[int], device: DeviceLike):
    """YaRN: NTK-by-parts frequencies and the attention temperature.

    YaRN, arXiv:2309.00071, eqs. 17-22. Pair ``i`` turns ``r_i = L / λ_i`` times over the original
    length; pairs that turn often (short wavelengths) keep ``θ_i``, pairs that turn rarely are
    interpolated to ``θ_i / s``, and between them ``θ'_i = (1 - γ_i) θ_i / s + γ_i θ_i`` (eq. 20).
    As in the authors' code (and Hugging Face's ``"yarn"``), the ramp ``1 - γ_i`` is linear in the
    pair index ``i`` rather than in ``r`` (eq. 18): it rises from 0 at ``i_fast`` to 1 at ``i_slow``,
    where ``i_β = D ln(L / (2π β)) / (2 ln b)`` is the (fractional) index of the pair that turns
    ``β`` times; with ``truncate`` the two are rounded outwards (floor, ceil), and they are clipped to
    ``[0, D - 1]`` as in that code. Equal betas (Kimi-K2 publishes ``beta_fast = beta_slow = 1``)
    leave a ramp one pair wide, or 0.001 wide where the two indices coincide (the authors' guard).

    The attention scale is ``attention_factor`` if given; else, with DeepSeek's ``mscale`` and
    ``mscale_all_dim``, ``yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim)``; else
    ``yarn_mscale(s) = 0.1 ln s + 1`` (eq. 22).

    Args:
        config: ``{"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L}`` and
            optionally ``beta_fast`` (default 32), ``beta_slow`` (default 1), ``truncate`` (default
            ``True``), ``attention_factor``, or both ``mscale`` and ``mscale_all_dim``.

    Returns:
        ``(D/2,)`` float32 frequencies and the attention scale.

    Raises:
        ValueError: missing or extra keys, ``factor < 1``, non-positive lengths, betas or scales,
            ``beta_fast < beta_slow``, a non-bool ``truncate``, only one of ``mscale`` and
            ``mscale_all_dim``, or ``attention_factor`` together with them.
    """
    p = _params(config, "yarn", ("factor", "original_max_position_embeddings"), _YARN_OPTIONAL)
    factor, L = _factor(p, "yarn"), _length(p, "yarn")
    fast, slow = _real(p, "yarn", "beta_fast"), _real(p, "yarn", "beta_slow")
    if fast < slow:
        raise ValueError(f"beta_fast of a 'yarn' scaling must be >= beta_slow, got beta_fast={fast}, beta_slow={slow}")
    if not isinstance(p["truncate"], bool):
        raise ValueError(f"truncate of a 'yarn' scaling must be a bool, got {p['truncate']!r}")

    lo, hi = _yarn_ramp_ends(head_dim, base, L, fast, slow, p["truncate"])
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)  # (D/2,) 1 - γ_i
    inv_freq = default_inv_freq(head_dim, base, {}, None, "cpu")[0].double()
    scaled = (inv_freq * (1 - ramp) + inv_freq / factor * ramp).float().to(device)  # (D/2,)

    return scaled, _yarn_attention(p, factor)


#: YaRN's optional keys and their defaults.
_YARN_OPTIONAL = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, "attention_factor": None, "mscale": None,
                  "mscale_all_dim": None}


def _yarn_ramp_ends(head_dim: int, base: float, L: int, fast: float, slow: float, truncate: bool) -> tuple:
    """The pair indices where YaRN's ramp starts and ends: ``i_β = D ln(L / (2π β)) / (2 ln b)``, the
    (fractional) index of the pair that turns ``β`` times over ``L``, for ``β`` = ``fast``, ``slow``;
    rounded outwards with ``truncate``, clipped to ``[0, D - 1]``, 0.001 apart at least (the
    authors' guard against a zero-width ramp). In the authors' order of operations."""
    lo, hi = (head_dim * math.log(L / (r * 2 * math.pi)) / (2 * math.log(base)) for r in (fast, slow))
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    return lo, (hi + 0.001 if hi == lo else hi)


def _yarn_attention(p: dict, factor: float) -> float:
    """YaRN's attention scale from a checked ``yarn`` mapping: ``attention_factor``, DeepSeek's
    mscale ratio, or eq. 22."""
    mscale, mscale_all_dim = p["mscale"], p["mscale_all_dim"]
    if (mscale is None) != (mscale_all_dim is None):
        raise ValueError(
            f"a 'yarn' scaling takes mscale and mscale_all_dim together or neither, got mscale={mscale!r} and "
            f"mscale_all_dim={mscale_all_dim!r} (Hugging Face ignores one alone; give attention_factor instead)"
        )
    if p["attention_factor"] is not None:
        if mscale is not None:
            raise ValueError("a 'yarn' scaling takes attention_factor or mscale/mscale_all_dim, not both")
        return _real(p, "yarn", "attention_factor")
    if mscale is not None:
        return yarn_mscale(factor, _real(p, "yarn", "mscale")) / yarn_mscale(factor, _real(p, "yarn", "mscale_all_dim"))
    return yarn_mscale(factor)


def llama3_inv_freq(head_dim: int, base: float, config: Mapping, seq_len: Optional[int], device: DeviceLike):
    """Llama 3.1's scaling: unchanged short wavelengths, ``θ_i / s`` long ones, a blend between.

    Meta's Llama 3.1 (arXiv:2407.21783 names it; the formula is in Meta's reference code,
    ``apply_scaling``). With ``L`` the original length, wavelengths ``λ_i < L / high_freq_factor``
    keep ``θ_i``, wavelengths ``λ_i > L / low_freq_factor`` get ``θ_i / s``, and in between
    ``θ'_i = (1 - w) θ_i / s + w θ_i`` with ``w = (L / λ_i - low_freq_factor) / (high_freq_factor -
    low_freq_factor)``, which is continuous at both cut-offs. Hugging Face's ``"llama3"``. With
    ``low_freq_factor = high_freq_factor`` (Llama 4) the blend is empty: ``θ_i`` below the cut-off
    wavelength, ``θ_i / s`` above it (Hugging Face computes the same, with NaN for a pair exactly
    at the cut-off, which posenc leaves unscaled).

    Args:
        config: ``{"rope_type": "llama3", "factor": s, "low_freq_factor": a, "high_freq_factor": c,
            "original_max_position_embeddings": L}``, ``0 < a <= c``.

    Returns:
        ``(D/2,)`` float32 frequencies and attention scale 1.0.

    Raises:
        ValueError: missing or extra keys, ``factor < 1``, non-positive ``L`` or frequency factors,
            ``high_freq_factor < low_freq_factor``.
    """
    p = _params(config, "llama3", ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))
    factor, L = _factor(p, "llama3"), _length(p, "llama3")
    low, high = _real(p, "llama3", "low_freq_factor"), _real(p, "llama3", "high_freq_factor")
    if high < low:
        raise ValueError(f"high_freq_factor of a 'llama3' scaling must be >= low_freq_factor, got {high} and {low}")
    inv_freq = default_inv_freq(head_dim, base, {}, None, "cpu")[0].double()  # (D/2,)
    wavelength = 2 * math.pi / inv_freq
    if high == low:  # no blend: a step at λ = L / low (Llama 4); a pair exactly there keeps θ_i
        w = (L / wavelength >= low).double()
    else:
        w = ((L / wavelength - low) / (high - low)).clamp(0, 1)  # 0 for λ >= L/low, 1 for λ <= L/high
    return (inv_freq * (1 - w) / factor + inv_freq * w).float().to(device), 1.0


#: LongRoPE's optional keys (neither has a default: one of them is needed).
_LONGROPE_OPTIONAL = {"factor": None, "attention_factor": None}


def longrope_inv_freq(head_dim: int, base: float, config: Mapping, seq_len: Optional[int], device: DeviceLike):
    """LongRoPE: a searched rescale factor per pair, one set for short and one for long inputs.

    Ding et al. 2024, arXiv:2402.13753: non-uniform interpolation ``θ_i / a_i``, with a factor
    ``a_i`` per pair found by search (the paper's ``λ_i``, not a wavelength here). As Phi-3 uses it
    (arXiv:2404.14219), the factors are ``short_factor`` while ``seq_len <= L`` (the original length)
    and ``long_factor`` once ``seq_len > L``. The attention scale is ``attention_factor`` if given,
    else Phi-3's ``sqrt(1 + ln s / ln L)`` (1 for ``s <= 1``), where ``s = factor`` (Hugging Face
    derives it as ``max_position_embeddings / L`` when the config has none). Hugging Face's
    ``"longrope"``.

    Args:
        config: ``{"rope_type": "longrope", "short_factor": [...], "long_factor": [...],
            "original_max_position_embeddings": L}`` with two lists of ``D/2`` positive numbers, and
            ``factor`` or ``attention_factor`` (or both).
        seq_len: current length (the largest position + 1); required.

    Returns:
        ``(D/2,)`` float32 frequencies and the attention scale.

    Raises:
        ValueError: missing or extra keys, factor lists of the wrong length or with non-positive
            entries, neither ``factor`` nor ``attention_factor``, no ``seq_len``.
    """
    required = ("short_factor", "long_factor", "original_max_position_embeddings")
    p = _params(config, "longrope", required, _LONGROPE_OPTIONAL)
    L = _length(p, "longrope", minimum=2)  # its attention scale divides by ln L
    for key in ("short_factor", "long_factor"):
        value = p[key]
        if (
            isinstance(value, (str, bytes))
            or not isinstance(value, Sequence)
            or len(value) != head_dim // 2
            or not all(_is_number(v) and v > 0 for v in value)
        ):
            raise ValueError(
                f"{key} of a 'longrope' scaling must be a list of head_dim/2 = {head_dim // 2} positive numbers, "
                f"got {value!r}"
            )
    if p["factor"] is None and p["attention_factor"] is None:
        raise ValueError("a 'longrope' scaling needs 'factor' (for the attention scale) or 'attention_factor'")
    # a factor below 1 (a model shorter than its original length) only sets the attention scale to 1
    factor = None if p["factor"] is None else _real(p, "longrope", "factor")
    n = _need_seq_len(seq_len, "longrope")
    rescale = torch.tensor(p["long_factor"] if n > L else p["short_factor"], dtype=torch.float64)  # (D/2,)
    inv_freq = _scaled(default_inv_freq(head_dim, base, {}, None, "cpu")[0], rescale, device)
    if p["attention_factor"] is not None:
        return inv_freq, _real(p, "longrope", "attention_factor")
    return inv_freq, 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(L))


def proportional_inv_freq(head_dim: int, base: float, config: Mapping, seq_len: Optional[int], device: DeviceLike):
    """Proportional RoPE: the first ``int(p D / 2)`` pairs rotate, the others do not.

    Hugging Face's ``"proportional"`` (Gemma 4's global layers): pair ``i < n = int(p D / 2)`` has
    ``θ_i / s`` with ``θ_i = b^(-2i/D)`` of the *whole* head (the exponents are those of ``D``, not of
    ``2n`` as in partial rotary), and pairs ``i >= n`` have frequency 0: they pass through unrotated,
    at the end of each half in the ``"half"`` layout rather than at the end of the head.

    Args:
        config: ``{"rope_type": "proportional"}`` and optionally ``factor`` ``s`` (default 1) and
            ``proportion`` ``p`` in ``[0, 1]`` (Hugging Face's ``partial_rotary_factor`` of this
            type; default 1: RoFormer's frequencies divided by ``s``).

    Returns:
        ``(D/2,)`` float32 frequencies and attention scale 1.0.
    """
    p = _params(config, "proportional", (), {"factor": 1.0, "proportion": 1.0})
    factor = _real(p, "proportional", "factor")
    proportion = _real(p, "proportional", "proportion", inclusive=True)
    if proportion > 1:
        raise ValueError(f"proportion of a 'proportional' scaling must be in [0, 1], got {proportion!r}")
    rotated = int(proportion * head_dim // 2)
    inv_freq = default_inv_freq(head_dim, base, {}, None, "cpu")[0]  # (D/2,)
    inv_freq[rotated:] = 0.0
    return _scaled(inv_freq, factor, device), 1.0


#: Scaling name (Hugging Face's ``rope_type``) -> function ``(head_dim, base, config, seq_len, device)
#: -> (inv_freq, attention_scale)``. Every variant shares this signature; adding one is adding an entry.
ROPE_SCALINGS: dict[str, Callable] = {
    "default": default_inv_freq,
    "linear": linear_inv_freq,
    "ntk_aware": ntk_aware_inv_freq,
    "dynamic": dynamic_inv_freq,
    "yarn": yarn_inv_freq,
    "llama3": llama3_inv_freq,
    "longrope": longrope_inv_freq,
    "proportional": proportional_inv_freq,
}

#: ``rope_type`` values whose frequencies depend on ``seq_len`` (it must be given for them).
LENGTH_DEPENDENT = ("dynamic", "longrope")

#: The two arithmetics of :func:`inverse_frequencies` and :func:`~posenc.rope.rotation.rope_cos_sin`,
#: ``"exact"`` (a scaling applied in fp64 to the reference fp32 ``θ_i`` and rounded once; angles past
#: :data:`~posenc.rope.rotation.FP64_ANGLES_FROM` in fp64: no rounding beyond the checkpoint's own
#: fp32 ``θ_i`` and the fp32 frequencies, a few 1e-7 relative) and ``"transformers"`` (every step in
#: fp32, in the order of ``transformers.modeling_rope_utils``: what checkpoints were trained and
#: are run with, bit for bit).
ARITHMETICS = ("exact", "transformers")


# --------------------------------------------------------------------------- transformers' fp32 arithmetic


def _fp32_linear(head_dim, base, p, seq_len):
    return _fp32_theta(head_dim, base)[1] / p["factor"]


def _fp32_yarn(head_dim, base, p, seq_len):
    powers, extrapolation = _fp32_theta(head_dim, base)
    interpolation = 1.0 / (p["factor"] * powers)
    lo, hi = _yarn_ramp_ends(head_dim, base, p["original_max_position_embeddings"], p["beta_fast"], p["beta_slow"],
                             p["truncate"])
    keep = 1 - torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
    return interpolation * (1 - keep) + extrapolation * keep


def _fp32_llama3(head_dim, base, p, seq_len):
    inv_freq = _fp32_theta(head_dim, base)[1]
    factor, low, high, L = p["factor"], p["low_freq_factor"], p["high_freq_factor"], p["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > L / low, inv_freq / factor, inv_freq)
    if high == low:  # transformers' blend divides by zero there; its only pair would sit exactly at L / low
        return torch.where(L / wavelength >= low, inv_freq, inv_freq / factor)
    smooth = (L / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < L / high) * ~(wavelength > L / low)
    return torch.where(medium, smoothed, scaled)


def _fp32_longrope(head_dim, base, p, seq_len):
    rescale = p["long_factor"] if seq_len > p["original_max_position_embeddings"] else p["short_factor"]
    return 1.0 / (torch.tensor(rescale, dtype=torch.float32) * _fp32_theta(head_dim, base)[0])


def _fp32_dynamic(head_dim, base, p, seq_len):
    # transformers' dynamic update passes the length as a tensor: the new base is computed in fp32
    L, factor = p["original_max_position_embeddings"], p["factor"]
    if seq_len <= L:
        return _fp32_theta(head_dim, base)[1]
    n = torch.tensor(seq_len)  # int64, as torch.max(position_ids) + 1
    new_base = base * ((factor * n / L) - (factor - 1)) ** (head_dim / (head_dim - 2))  # fp32 0-d tensor
    return _fp32_theta(head_dim, new_base)[1]


def _fp32_proportional(head_dim, base, p, seq_len):
    rotated = int(p["proportion"] * head_dim // 2)
    inv_freq = _fp32_theta(head_dim, base)[1]
    inv_freq[rotated:] = 0.0
    return inv_freq / p["factor"]


#: The scalings whose exact and fp32 arithmetic differ (the others compute one fp32 power of a
#: double base either way), with the keys and defaults their fp32 form reads.
_FP32 = {
    "linear": (_fp32_linear, ("factor",), {}),
    "dynamic": (_fp32_dynamic, ("factor", "original_max_position_embeddings"), {}),
    "yarn": (_fp32_yarn, ("factor", "original_max_position_embeddings"), _YARN_OPTIONAL),
    "llama3": (_fp32_llama3, ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), {}),
    "longrope": (_fp32_longrope, ("short_factor", "long_factor", "original_max_position_embeddings"), _LONGROPE_OPTIONAL),
    "proportional": (_fp32_proportional, (), {"factor": 1.0, "proportion": 1.0}),
}


def inverse_frequencies(
    head_dim: int,
    base: float = 10000.0,
    scaling: Optional[Mapping] = None,
    *,
    seq_len: Optional[int] = None,
    device: DeviceLike = None,
    arithmetic: str = "exact",
) -> tuple[Tensor, float]:
    """Inverse frequencies ``θ_i`` of RoPE and the attention scale that goes with them.

    RoFormer, arXiv:2104.09864, eq. (15): ``θ_i = base^(-2i/D)``, ``i = 0 .. D/2 - 1``, changed by
    ``scaling`` (the module docstring lists the variants).

    Args:
        head_dim: number of rotated dimensions ``D`` (the head dim, or ``rotary_dim`` for partial
            rotary); a positive even int.
        base: the frequency base (``rope_theta`` in Hugging Face configs); > 1.
        scaling: ``None`` for RoFormer's frequencies, or a mapping with a ``"rope_type"`` key (or
            Hugging Face's legacy ``"type"``) naming an entry of
            :data:`~posenc.rope.frequencies.ROPE_SCALINGS`, plus that variant's keys (see its
            function); any other key is an error.
            :func:`~posenc.rope.hf_config.scaling_from_hf` builds it from a checkpoint's config.
        seq_len: current length (the largest position + 1); required by the length-dependent
            variants (:data:`~posenc.rope.frequencies.LENGTH_DEPENDENT`), ignored by the others.
        device: device of the result.
        arithmetic: ``"exact"`` (default: a scaling is applied in fp64 and rounded once) or
            ``"transformers"`` (every step in fp32 in transformers' order: its ``inv_freq`` bit for
            bit, what a checkpoint was trained with). The frequencies differ by at most a few
            fp32 ulps (relative 3e-7); with the angles of :func:`~posenc.rope.rotation.rope_cos_sin`
            in the same arithmetic, cos/sin at position 131,071 differ by about 1e-3 (Llama 3.1,
            Qwen2.5 with YaRN), mostly from rounding the fp32 angle.

    Returns:
        ``(inv_freq, attention_scale)``: ``inv_freq`` float32 of shape ``(D/2,)``; a Python float
        that multiplies cos and sin (1.0 without scaling).

    Raises:
        ValueError: an unknown ``arithmetic``, odd or non-positive ``head_dim``, ``base <= 1``, a non-positive ``seq_len``, a
            scaling without a ``rope_type``, an unknown ``rope_type``, a key the variant does not take
            (``rope_theta`` goes to ``base``), a missing or invalid parameter.
        TypeError: ``scaling`` that is not a mapping.
    """
    _check_head_dim(head_dim)
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 1:
        raise ValueError(f"base must be a finite number > 1, got {base!r}")
    if seq_len is not None and (not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1):
        raise ValueError(f"seq_len must be None or a positive int (the largest position + 1), got {seq_len!r}")
    if scaling is None:
        rope_type, config = "default", {}
    elif isinstance(scaling, Mapping):
        rope_type, config = _rope_type(scaling), scaling
    else:
        raise TypeError(f"scaling must be None or a mapping with a 'rope_type' key, got {type(scaling).__name__}")
    if rope_type not in ROPE_SCALINGS:
        raise ValueError(f"unknown rope_type {rope_type!r} in scaling; known: {sorted(ROPE_SCALINGS)}")
    moved = {"rope_theta": "pass it as base", "partial_rotary_factor": "pass the rotated dims as head_dim"}
    for key, where in moved.items():
        if key in config:
            raise ValueError(f"scaling has {key}={config[key]!r}: {where} (scaling_from_hf reads an HF config)")
    if rope_type == "default":  # default_inv_freq stays the bare reference formula: its keys are checked here
        _params(config, "default", ())
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"arithmetic must be one of {ARITHMETICS}, got {arithmetic!r}")
    inv_freq, attention_scale = ROPE_SCALINGS[rope_type](head_dim, float(base), config, seq_len, device)
    if arithmetic == "transformers" and rope_type in _FP32:  # checked above; now transformers' fp32 steps
        fp32, required, optional = _FP32[rope_type]
        inv_freq = fp32(head_dim, float(base), _params(config, rope_type, required, optional), seq_len).to(device)
    return inv_freq, float(attention_scale)


def _rope_type(scaling: Mapping) -> str:
    """The ``rope_type`` (or legacy ``type``) of a scaling mapping; ``"default"`` for an empty one."""
    rope_type, legacy = scaling.get("rope_type", _MISSING), scaling.get("type", _MISSING)
    if rope_type is not _MISSING and legacy is not _MISSING and rope_type != legacy:
        raise ValueError(f"scaling has rope_type={rope_type!r} and type={legacy!r}; give one (they are the same key)")
    rope_type = legacy if rope_type is _MISSING else rope_type
    if rope_type is _MISSING:
        if scaling:
            raise ValueError(
                f"scaling has no 'rope_type' key (keys: {sorted(scaling)}); known rope types: {sorted(ROPE_SCALINGS)}"
            )
        return "default"
    return rope_type


def wavelengths(inv_freq: Tensor) -> Tensor:
    """Wavelength ``2π / θ_i`` of each pair, in positions: how far a token moves before pair ``i``
    has turned a full circle. ``(D/2,)`` float64."""
    return 2 * math.pi / inv_freq.double()
