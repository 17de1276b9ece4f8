"""Reading RoPE's settings from a Hugging Face checkpoint's ``config.json``.

A checkpoint states its RoPE in one of two forms: the newer ``rope_parameters`` dict, with
``rope_type`` and ``rope_theta`` inside it, or the legacy ``rope_scaling`` dict (``type`` or
``rope_type``, no theta) with ``rope_theta`` beside it in the config. :func:`scaling_from_hf` reads
either and returns what :func:`~posenc.rope.frequencies.inverse_frequencies` and
:class:`~posenc.rope.rotation.RotaryEmbedding` take: the base, the scaling mapping and the number of
rotated dimensions. It checks every key: a missing one or one it does not know raises, naming the
key, its value and what is allowed; only the keys Hugging Face documents as optional take their
documented defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Optional

#: The ``rope_type`` values of Hugging Face's ``ROPE_INIT_FUNCTIONS`` that posenc computes, with the
#: keys each reads from the rope dict besides ``rope_type``/``type``, ``rope_theta`` and
#: ``partial_rotary_factor``: ``(required, optional)``.
HF_ROPE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "yarn": (
        ("factor",),
        ("original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
         "truncate"),
    ),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor"), ("original_max_position_embeddings",)),
    "longrope": (("short_factor", "long_factor"), ("original_max_position_embeddings", "factor", "attention_factor")),
}

# keys of a rope dict that every type reads: the type, the base and the partial rotary factor
_SHARED = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


class HFRope(NamedTuple):
    """RoPE as a Hugging Face config states it, in the arguments posenc takes."""

    #: ``rope_theta``: the ``base`` of :func:`~posenc.rope.frequencies.inverse_frequencies`.
    base: float
    #: ``None`` (plain RoPE) or the ``scaling`` mapping of
    #: :func:`~posenc.rope.frequencies.inverse_frequencies` and
    #: :class:`~posenc.rope.rotation.RotaryEmbedding`.
    scaling: Optional[dict]
    #: Rotated dims per head, ``R = int(head_dim * partial_rotary_factor)`` (the ``head_dim`` argument
    #: of ``inverse_frequencies``, the ``rotary_dim`` of ``RotaryEmbedding``); ``None`` when the
    #: config gives no head size (a rope dict alone).
    rotary_dim: Optional[int]


def _one_value(name: str, sources: list[tuple[str, object]]):
    """The value of ``name`` given in one or more places (``None`` where given in none).

    Raises:
        ValueError: two places give different values.
    """
    given = [(where, value) for where, value in sources if value is not None]
    for where, value in given[1:]:
        if value != given[0][1]:
            raise ValueError(f"{name} is {given[0][1]!r} in {given[0][0]} but {value!r} in {where}; give one value")
    return given[0][1] if given else None


def _agreed(key: str, rope: Mapping, whole: Mapping, argument=None):
    """``key`` from the rope dict, the whole config or an argument, equal wherever given twice."""
    sources = [("the rope dict", rope.get(key)), ("the config", whole.get(key)), ("the argument", argument)]
    return _one_value(key, sources)


def _split(config: Mapping) -> tuple[Mapping, Mapping]:
    """``(rope dict, whole config)``: a mapping with ``rope_type``/``type`` is a rope dict alone."""
    if "rope_type" in config or "type" in config:
        return config, {}
    sources = [(key, config.get(key)) for key in ("rope_parameters", "rope_scaling")]
    rope = _one_value("the rope dict", sources)
    if rope is not None and not isinstance(rope, Mapping):
        raise TypeError(f"rope_parameters / rope_scaling must be a dict, got {type(rope).__name__}")
    if rope and "rope_type" not in rope and "type" not in rope and all(isinstance(v, Mapping) for v in rope.values()):
        raise ValueError(f"the rope dict is nested per layer type ({sorted(rope)}); pass one of them, with rope_theta")
    return rope or {}, config


def _rope_type(rope: Mapping) -> str:
    """The rope dict's type, its keys checked against those the type reads."""
    rope_type = _one_value("rope_type", [(k, rope[k]) for k in ("rope_type", "type") if k in rope]) or "default"
    if rope_type not in HF_ROPE_KEYS:
        raise ValueError(f"rope_type {rope_type!r} is not one posenc reads; known: {sorted(HF_ROPE_KEYS)}")
    required, optional = HF_ROPE_KEYS[rope_type]
    reads = f"it reads {list(required)}" + (f", optionally {list(optional)}" if optional else "")
    for key, value in rope.items():
        if key not in required + optional + _SHARED:
            raise ValueError(f"key {key!r} (value {value!r}) is not read by rope_type {rope_type!r}; {reads}")
    for key in required:
        if key not in rope and not (rope_type == "yarn" and key == "factor"):  # yarn's may be derived
            raise ValueError(f"rope_type {rope_type!r} needs the key {key!r} in the rope dict; {reads}")
    return rope_type


def _original_length(rope_type: str, rope: Mapping, whole: Mapping, max_len: Optional[int]) -> int:
    """The pre-training length ``L`` a scaling of ``rope_type`` reads, as Hugging Face finds it."""
    if rope_type == "dynamic":
        original = whole.get("original_max_position_embeddings")
        if max_len is None:
            raise ValueError("rope_type 'dynamic' scales past max_position_embeddings: pass max_position_embeddings=")
        if original is not None and original != max_len:
            raise ValueError(
                f"rope_type 'dynamic' scales past max_position_embeddings={max_len}; the config's "
                f"original_max_position_embeddings={original} is not read by it (Hugging Face ignores it too)"
            )
        return max_len
    original = _agreed("original_max_position_embeddings", rope, whole)
    original = max_len if original is None else original
    if original is None:
        raise ValueError(f"rope_type {rope_type!r} needs original_max_position_embeddings (or max_position_embeddings)")
    return original


def scaling_from_hf(
    config: Mapping, max_position_embeddings: Optional[int] = None, *, rope_theta: Optional[float] = None
) -> HFRope:
    """The base, scaling and rotated dims of a Hugging Face checkpoint's RoPE.

    Give it the whole ``config.json`` (a dict, or a ``transformers`` config object), or only its rope
    dict (``rope_parameters``, or ``rope_scaling`` with ``rope_theta=`` from beside it)::

        cfg = json.load(open("config.json"))
        base, scaling, rotary_dim = scaling_from_hf(cfg)
        inv_freq, attention_scale = inverse_frequencies(rotary_dim, base, scaling, seq_len=n)
        rope = RotaryEmbedding(head_dim, n, base, rotary_dim=rotary_dim, scaling=scaling)

        scaling_from_hf({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                         "rope_theta": 1e6})                        # Qwen3's long-context setting
        scaling_from_hf(cfg["rope_scaling"], cfg["max_position_embeddings"], rope_theta=cfg["rope_theta"])

    The result's frequencies and attention scale are those of ``transformers.modeling_rope_utils``
    for the same config. What it reads, and its defaults, are Hugging Face's:

    * ``rope_theta``: inside the rope dict, beside it in the config, or the argument (equal where
      given twice); required (Hugging Face's fallback depends on the model class).
    * the type: ``rope_type`` or legacy ``type`` (equal if both); ``"default"`` if neither.
    * ``partial_rotary_factor`` (default 1.0), in the rope dict or the config; the head size is the
      config's ``head_dim``, or ``hidden_size // num_attention_heads``.
    * ``original_max_position_embeddings`` (``yarn``, ``llama3``, ``longrope``): in the rope dict or
      the config (Phi-3 keeps it there), default ``max_position_embeddings``.
    * ``dynamic``: the original length is ``max_position_embeddings`` (required).
    * ``yarn``: ``factor`` may be ``null``, and is then ``max_position_embeddings / original``;
      optional ``beta_fast`` (32), ``beta_slow`` (1), ``truncate`` (true), ``attention_factor``,
      ``mscale`` and ``mscale_all_dim`` (DeepSeek: both, or neither).
    * ``longrope``: ``factor``, if absent, is ``max_position_embeddings / original`` (it only sets
      the attention scale); ``attention_factor`` optional.

    A key set to ``null`` counts as absent. Nested per-layer rope dicts (Gemma 3's
    ``{"full_attention": {...}, "sliding_attention": {...}}``) are refused: pass one of them.

    Args:
        config: a whole config (a mapping, or an object with ``to_dict()``), or a rope dict (a
            mapping with ``rope_type`` or ``type``).
        max_position_embeddings: the config's ``max_position_embeddings``, where ``config`` is a
            rope dict alone (read from a whole config otherwise; equal if both).
        rope_theta: the base, where the rope dict does not hold it (a legacy ``rope_scaling``).

    Returns:
        :class:`HFRope` ``(base, scaling, rotary_dim)``; ``scaling`` is ``None`` for ``"default"``.

    Raises:
        TypeError: ``config`` (or its rope dict) that is not a mapping.
        ValueError: a missing key, a key the type does not read, an unknown ``rope_type``, values
            that disagree between two places, nested per-layer rope dicts, a partial rotary factor
            without a head size.
    """
    if not isinstance(config, Mapping) and callable(getattr(config, "to_dict", None)):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        kind = type(config).__name__
        raise TypeError(f"config must be a mapping (config.json as a dict) or have to_dict(), got {kind}")
    rope, whole = _split(config)
    rope_type = _rope_type(rope)
    base = _agreed("rope_theta", rope, whole, rope_theta)
    if base is None:
        raise ValueError("rope_theta is in neither the rope dict nor the config; pass rope_theta=")
    if not isinstance(base, (int, float)) or isinstance(base, bool):
        raise TypeError(f"rope_theta must be a number, got {base!r}")
    max_len = _one_value(
        "max_position_embeddings",
        [("the config", whole.get("max_position_embeddings")), ("the argument", max_position_embeddings)],
    )
    rotary_dim = _rotary_dim(rope, whole)
    if rope_type == "default":
        return HFRope(float(base), None, rotary_dim)
    params = {k: v for k, v in rope.items() if k not in _SHARED and v is not None}
    if rope_type in ("dynamic", "yarn", "llama3", "longrope"):
        params["original_max_position_embeddings"] = _original_length(rope_type, rope, whole, max_len)
    if rope_type in ("yarn", "longrope") and params.get("factor") is None and max_len is not None:
        params["factor"] = max_len / params["original_max_position_embeddings"]
    if rope_type == "yarn" and params.get("factor") is None:
        raise ValueError("rope_type 'yarn' has no factor: pass max_position_embeddings= to derive it")
    if rope_type == "longrope" and params.get("factor") is None and params.get("attention_factor") is None:
        raise ValueError("rope_type 'longrope' has neither factor nor attention_factor: pass max_position_embeddings=")
    return HFRope(float(base), {"rope_type": rope_type, **params}, rotary_dim)


def _rotary_dim(rope: Mapping, whole: Mapping) -> Optional[int]:
    """``int(head_dim * partial_rotary_factor)``, Hugging Face's rotated dims; ``None`` without a head size."""
    factor = _agreed("partial_rotary_factor", rope, whole)
    head_dim = whole.get("head_dim")
    if head_dim is None and whole.get("hidden_size") is not None and whole.get("num_attention_heads") is not None:
        head_dim = whole["hidden_size"] // whole["num_attention_heads"]
    if head_dim is None:
        if factor is not None and factor != 1:
            raise ValueError(
                f"partial_rotary_factor={factor} needs the head size: pass the whole config "
                "(head_dim, or hidden_size and num_attention_heads)"
            )
        return None
    factor = 1.0 if factor is None else factor
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ValueError(f"partial_rotary_factor must be a number in (0, 1], got {factor!r}")
    return int(head_dim * factor)
