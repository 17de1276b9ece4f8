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
    "proportional": ((), ("factor",)),
}

# keys of a rope dict that every type reads: the type, the base and the partial rotary factor
_SHARED = ("rope_type", "type", "rope_theta", "partial_rotary_factor")

# multimodal RoPE's keys (Qwen2-VL, Qwen2.5-VL: legacy type "mrope"; Qwen3-VL: mrope_interleaved),
# read with the default frequencies
_MROPE = ("mrope_section", "mrope_interleaved")

# where a config states a rope: a whole config without any of these holds it in its text_config
_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "rope_local_base_freq")


class HFRopeFields(NamedTuple):
    """The three fields :class:`HFRope` unpacks as."""

    #: The ``base`` of :func:`~posenc.rope.frequencies.inverse_frequencies` (the config's ``rope_theta``).
    base: float
    #: ``None`` (plain RoPE) or the ``scaling`` mapping of
    #: :func:`~posenc.rope.frequencies.inverse_frequencies` and
    #: :class:`~posenc.rope.rotation.RotaryEmbedding`.
    scaling: Optional[dict]
    #: Rotated dims per head, ``R = int(head_dim * partial_rotary_factor)`` (the ``head_dim`` argument
    #: of ``inverse_frequencies``, the ``rotary_dim`` of ``RotaryEmbedding``); ``None`` when the
    #: config gives no head size (a rope dict alone). The head size is ``qk_rope_head_dim`` where the
    #: config has one (the decoupled rotary head of multi-head latent attention: DeepSeek-V2/V3,
    #: Kimi-K2), else ``head_dim``, else ``hidden_size // num_attention_heads``.
    rotary_dim: Optional[int]


class HFRope(HFRopeFields):
    """RoPE as a Hugging Face config states it, in the arguments posenc takes.

    It unpacks as ``base, scaling, rotary_dim``. Two attributes say how the model applies it:
    :attr:`layout` (the pairing of dimensions its code rotates) and :attr:`mrope` (set for a
    multimodal config: then the positions are three per token and cos/sin come from
    :func:`~posenc.rope.multimodal.mrope_cos_sin`, not :func:`~posenc.rope.rotation.rope_cos_sin`).
    Compared with a plain tuple, only the three fields count.
    """

    #: ``None``, or multimodal RoPE's keyword arguments of
    #: :func:`~posenc.rope.multimodal.mrope_cos_sin` (``{"sections": (t, h, w), "interleaved": bool}``):
    #: each frequency pair turns with the temporal, height or width position (Qwen2-VL's ``mrope``).
    mrope: Optional[dict]
    #: ``"half"`` or ``"interleaved"``, the ``layout`` argument of
    #: :func:`~posenc.rope.rotation.apply_rope` that rotates the pairs the model's code rotates
    #: (:data:`~posenc.rope.hf_config.LAYOUT_BY_MODEL_TYPE`); ``None`` where posenc does not know the
    #: model type (check the model's code: transformers' ``rotate_half`` is ``"half"``).
    layout: Optional[str]

    def __new__(cls, base: float, scaling: Optional[dict], rotary_dim: Optional[int], mrope: Optional[dict] = None,
                layout: Optional[str] = None):
        self = super().__new__(cls, base, scaling, rotary_dim)
        self.mrope, self.layout = mrope, layout
        return self

    def __eq__(self, other) -> bool:
        if not tuple.__eq__(self, other):
            return False
        return not isinstance(other, HFRope) or (other.mrope, other.layout) == (self.mrope, self.layout)

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = None  # holds dicts

    def __repr__(self) -> str:
        extra = "" if self.mrope is None else f", mrope={self.mrope!r}"
        return (f"HFRope(base={self.base!r}, scaling={self.scaling!r}, rotary_dim={self.rotary_dim!r}{extra}, "
                f"layout={self.layout!r})")


#: The pairing of dimensions transformers' modelling code rotates, by ``model_type`` (read from each
#: model's ``rotate_half`` / ``rotate_every_two`` / complex multiplication). DeepSeek-V3 and the
#: models built on it read the config's ``rope_interleave`` (:data:`ROPE_INTERLEAVE_DEFAULT`).
LAYOUT_BY_MODEL_TYPE: dict[str, str] = {
    **dict.fromkeys(
        ("llama", "mistral", "mixtral", "qwen2", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text",
         "qwen3", "qwen3_moe", "qwen3_next", "qwen3_vl", "qwen3_vl_text", "gemma", "gemma2", "gemma3", "gemma3_text",
         "phi", "phi3", "gpt_neox", "olmo", "olmo2", "stablelm", "falcon", "starcoder2", "smollm3", "granite",
         "gpt_oss", "glm4_moe", "internlm2"), "half"),
    **dict.fromkeys(
        ("gptj", "codegen", "cohere", "cohere2", "glm", "glm4", "helium", "ernie4_5", "ernie4_5_moe", "deepseek_v2",
         "llama4", "llama4_text"), "interleaved"),
}

#: Model types whose layout is the config's ``rope_interleave``, and its default there (DeepSeek-V3,
#: and Kimi-K2 on DeepSeek-V3's architecture: interleaved pairs).
ROPE_INTERLEAVE_DEFAULT: dict[str, bool] = {"deepseek_v3": True, "kimi_k2": True}


def _layout(whole: Mapping) -> Optional[str]:
    model_type = whole.get("model_type")
    if model_type in ROPE_INTERLEAVE_DEFAULT:
        flag = whole.get("rope_interleave")
        return "interleaved" if (ROPE_INTERLEAVE_DEFAULT[model_type] if flag is None else flag) else "half"
    return LAYOUT_BY_MODEL_TYPE.get(model_type)


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


#: What a model class fills in where its ``config.json`` leaves a rope key out (the defaults of
#: transformers' config classes, and GPT-J's constant base), by ``model_type``; no other model
#: type's missing ``rope_theta`` is guessed. GPT-NeoX's ``rotary_emb_base`` and ``rotary_pct`` are
#: its names of ``rope_theta`` and ``partial_rotary_factor``.
MODEL_TYPE_DEFAULTS: dict[str, dict] = {
    "llama": {"rope_theta": 10000.0},  # LlamaConfig; Llama 2's config.json has no rope_theta
    "gpt_neox": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25},  # GPTNeoXConfig: rotary_pct 0.25
    "gptj": {"rope_theta": 10000.0, "rotary_dim": 64},  # GPT-J's code (10000 ** (2i / rotary_dim)); GPTJConfig
    "gemma3_text": {"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "head_dim": 256,
                    "num_attention_heads": 8},  # Gemma3TextConfig (gemma-3-4b-it's text_config relies on them)
}

_ALIASES = {"rotary_emb_base": "rope_theta", "rotary_pct": "partial_rotary_factor"}  # GPT-NeoX's names


def _stated(config: Mapping, key: str) -> bool:
    """Whether ``config`` gives ``key`` anywhere: at the top level or in its rope dict(s)."""
    if config.get(key) is not None:
        return True
    for where in ("rope_parameters", "rope_scaling"):
        rope = config.get(where)
        if isinstance(rope, Mapping):
            inner = [rope] + [v for v in rope.values() if isinstance(v, Mapping)]
            if any(d.get(key) is not None for d in inner):
                return True
    return False


def as_mapping(config) -> Mapping:
    """A config as a mapping: ``config.json`` as a dict, or a transformers config object's ``to_dict()``.

    Raises:
        TypeError: neither.
    """
    if not isinstance(config, Mapping) and callable(getattr(config, "to_dict", None)):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping (config.json as a dict) or have to_dict(), got {type(config).__name__}")
    return config


def _text_config(config: Mapping) -> Mapping:
    """The config that states the rope: a multimodal config's ``text_config`` where the top level
    has none of the rope keys; GPT-NeoX's names renamed, GPT-J's ``rotary_dim`` read as the
    partial rotary size, and the model class's defaults (:data:`MODEL_TYPE_DEFAULTS`) filled in."""
    inner = config.get("text_config")
    if isinstance(inner, Mapping) and not any(config.get(key) is not None for key in _ROPE_KEYS):
        config = inner
    config = dict(config)
    for old, new in _ALIASES.items():
        if config.get(old) is not None:
            if config.get(new) is not None and config[new] != config[old]:
                raise ValueError(f"{old}={config[old]!r} and {new}={config[new]!r} disagree; give one")
            config[new] = config.pop(old)
    for key, value in MODEL_TYPE_DEFAULTS.get(config.get("model_type"), {}).items():
        if not _stated(config, key):
            config[key] = value
    if config.get("model_type") == "gptj":  # rotary_dim of the head dim n_embd / n_head
        head = config.get("n_embd", config.get("hidden_size")) // config.get("n_head", config.get("num_attention_heads"))
        config.setdefault("head_dim", head)
        config["partial_rotary_factor"] = config.pop("rotary_dim") / head
    return config


def _nested(rope, whole: Mapping) -> bool:
    """Whether ``rope`` is a dict of rope dicts, one per layer type (transformers' per-layer form)."""
    if not isinstance(rope, Mapping) or not rope or "rope_type" in rope or "type" in rope:
        return False
    named = whole.get("layer_types")
    if named:
        return any(key in named for key in rope)
    return all(isinstance(v, Mapping) or v is None for v in rope.values())


def _per_layer_type(config: Mapping) -> Optional[dict]:
    """``{layer type: rope dict with its rope_theta}`` for a config with a rope per layer type (a
    nested rope dict, or Gemma 3's ``rope_local_base_freq`` for its sliding layers), else ``None``.
    A layer type whose rope is ``null`` (a layer without position) maps to ``None``."""
    sources = [(key, config.get(key)) for key in ("rope_parameters", "rope_scaling")]
    rope = _one_value("the rope dict", sources)
    if _nested(rope, config):
        theta = config.get("rope_theta")
        return {k: None if v is None else {**({} if theta is None else {"rope_theta": theta}), **v} for k, v in rope.items()}
    local = config.get("rope_local_base_freq")
    if local is None:
        return None
    # Gemma 3: global (full-attention) layers read rope_theta and rope_scaling; sliding-window layers
    # rope_local_base_freq and no scaling (transformers' Gemma3TextConfig does the same)
    if rope is not None and not isinstance(rope, Mapping):
        raise TypeError(f"rope_parameters / rope_scaling must be a dict, got {type(rope).__name__}")
    full = {**(rope or {"rope_type": "default"})}
    if config.get("rope_theta") is not None:
        full.setdefault("rope_theta", config["rope_theta"])
    return {"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": local}}


def _split(config: Mapping, layer_type: Optional[str] = None) -> tuple[Mapping, Mapping]:
    """``(rope dict, whole config)``: a mapping with ``rope_type``/``type`` is a rope dict alone; a
    config with a rope per layer type gives that of ``layer_type`` (required there)."""
    if "rope_type" in config or "type" in config:
        if layer_type is not None:
            raise ValueError(f"layer_type={layer_type!r} was given for a single rope dict; pass the whole config")
        return config, {}
    per_layer = _per_layer_type(config)
    if per_layer is not None:
        if layer_type not in per_layer:
            given = "no layer_type was given" if layer_type is None else f"layer_type={layer_type!r} is not one of them"
            raise ValueError(
                f"the config has a rope per layer type ({sorted(per_layer)}) and {given}; pass layer_type=, or read "
                "them all with scaling_by_layer_type"
            )
        rope = per_layer[layer_type]
        if rope is None:
            raise ValueError(f"layers of type {layer_type!r} have no rope (null in the config): they use no position")
        whole = {k: v for k, v in config.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
        return rope, whole
    if layer_type is not None and layer_type not in (config.get("layer_types") or ()):
        raise ValueError(f"layer_type={layer_type!r} is not among the config's layer_types {config.get('layer_types')}")
    sources = [(key, config.get(key)) for key in ("rope_parameters", "rope_scaling")]
    rope = _one_value("the rope dict", sources)
    if rope is not None and not isinstance(rope, Mapping):
        raise TypeError(f"rope_parameters / rope_scaling must be a dict, got {type(rope).__name__}")
    return rope or {}, config


def _rope_type(rope: Mapping) -> str:
    """The rope dict's type, its keys checked against those the type reads."""
    # Qwen2-VL's legacy "mrope" is the default frequencies with positions per section (transformers
    # rewrites rope_type to "default" and keeps type "mrope")
    named = [(k, "default" if rope[k] == "mrope" else rope[k]) for k in ("rope_type", "type") if k in rope]
    rope_type = _one_value("rope_type", named) or "default"
    if rope_type not in HF_ROPE_KEYS:
        raise ValueError(f"rope_type {rope_type!r} is not one posenc reads; known: {sorted(HF_ROPE_KEYS)}")
    required, optional = HF_ROPE_KEYS[rope_type]
    optional = optional + _MROPE
    reads = f"it reads {list(required)}" + (f", optionally {list(optional)}" if optional else "")
    for key, value in rope.items():
        if key not in required + optional + _SHARED:
            raise ValueError(f"key {key!r} (value {value!r}) is not read by rope_type {rope_type!r}; {reads}")
    for key in required:
        if key not in rope:  # a key set to null is given (yarn derives its factor from null); a missing one is not
            raise ValueError(f"rope_type {rope_type!r} needs the key {key!r} in the rope dict; {reads}")
    return rope_type


def _mrope(rope: Mapping) -> Optional[dict]:
    """Multimodal RoPE's keyword arguments from a rope dict, or ``None``."""
    sections = rope.get("mrope_section")
    legacy = "mrope" in (rope.get("rope_type"), rope.get("type"))
    if sections is None:
        if legacy or rope.get("mrope_interleaved"):
            raise ValueError("the rope dict is multimodal (mrope) but has no mrope_section")
        return None
    if (isinstance(sections, (str, bytes)) or not isinstance(sections, (list, tuple)) or len(sections) != 3
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in sections)):
        raise ValueError(f"mrope_section must be three non-negative ints (temporal, height, width), got {sections!r}")
    interleaved = rope.get("mrope_interleaved") or False
    if not isinstance(interleaved, bool):
        raise ValueError(f"mrope_interleaved must be a bool, got {interleaved!r}")
    return {"sections": tuple(sections), "interleaved": interleaved}


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
    config: Mapping,
    max_position_embeddings: Optional[int] = None,
    *,
    rope_theta: Optional[float] = None,
    layer_type: Optional[str] = None,
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
    * ``yarn``: ``factor`` is required; set to ``null`` it is ``max_position_embeddings / original``
      (transformers does the same, and raises for a missing one); optional ``beta_fast`` (32),
      ``beta_slow`` (1), ``truncate`` (true), ``attention_factor``, ``mscale`` and
      ``mscale_all_dim`` (DeepSeek: both, or neither).
    * ``longrope``: ``factor``, if absent, is ``max_position_embeddings / original`` (it only sets
      the attention scale); ``attention_factor`` optional.
    * ``proportional``: ``partial_rotary_factor`` is the share of pairs that rotate, not the
      rotated dims: ``rotary_dim`` is the whole head and the scaling carries it as ``proportion``.
    * multimodal RoPE (``type: "mrope"``, or ``mrope_section`` in a default rope dict, with Qwen3-VL's
      ``mrope_interleaved``): default frequencies, and :attr:`HFRope.mrope`.
    * a config with a rope per layer type (transformers' nested ``rope_parameters``, keyed by
      layer type, or Gemma 3's ``rope_local_base_freq`` for its sliding-window layers beside
      ``rope_theta`` and ``rope_scaling`` for its global ones): ``layer_type`` is required, and
      :func:`scaling_by_layer_type` reads every type at once.
    * a multimodal config whose top level has no rope keys is read from its ``text_config``.

    A key set to ``null`` counts as absent, except yarn's ``factor``.

    Args:
        config: a whole config (a mapping, or an object with ``to_dict()``), or a rope dict (a
            mapping with ``rope_type`` or ``type``).
        max_position_embeddings: the config's ``max_position_embeddings``, where ``config`` is a
            rope dict alone (read from a whole config otherwise; equal if both).
        rope_theta: the base, where the rope dict does not hold it (a legacy ``rope_scaling``).
        layer_type: for a config with a rope per layer type, which one (e.g. ``"full_attention"``,
            ``"sliding_attention"``); otherwise ``None`` or one of the config's ``layer_types``.

    Returns:
        :class:`HFRope` ``(base, scaling, rotary_dim)``; ``scaling`` is ``None`` for ``"default"``.

    Raises:
        TypeError: ``config`` (or its rope dict) that is not a mapping.
        ValueError: a missing key, a key the type does not read, an unknown ``rope_type``, values
            that disagree between two places, a rope per layer type without ``layer_type``, a
            partial rotary factor without a head size.
    """
    config = as_mapping(config)
    rope, whole = _split(_text_config(config), layer_type)
    rope_type = _rope_type(rope)
    mrope = _mrope(rope)
    base = _agreed("rope_theta", rope, whole, rope_theta)
    if base is None:
        raise ValueError("rope_theta is in neither the rope dict nor the config; pass rope_theta=")
    if not isinstance(base, (int, float)) or isinstance(base, bool):
        raise TypeError(f"rope_theta must be a number, got {base!r}")
    max_len = _one_value(
        "max_position_embeddings",
        [("the config", whole.get("max_position_embeddings")), ("the argument", max_position_embeddings)],
    )
    if rope_type == "proportional":
        proportion = _agreed("partial_rotary_factor", rope, whole)
        rotary_dim = _rotary_dim({}, {k: v for k, v in whole.items() if k != "partial_rotary_factor"})
        params = {k: v for k, v in rope.items() if k not in _SHARED + _MROPE and v is not None}
        scaling = {"rope_type": "proportional", **params, **({} if proportion is None else {"proportion": proportion})}
        return HFRope(float(base), scaling, rotary_dim, mrope, _layout(whole))
    rotary_dim = _rotary_dim(rope, whole)
    if rope_type == "default":
        return HFRope(float(base), None, rotary_dim, mrope, _layout(whole))
    params = {k: v for k, v in rope.items() if k not in _SHARED + _MROPE and v is not None}
    if rope_type in ("dynamic", "yarn", "llama3", "longrope"):
        params["original_max_position_embeddings"] = _original_length(rope_type, rope, whole, max_len)
    if rope_type in ("yarn", "longrope") and params.get("factor") is None and max_len is not None:
        params["factor"] = max_len / params["original_max_position_embeddings"]
    if rope_type == "yarn" and params.get("factor") is None:
        raise ValueError("rope_type 'yarn' has factor null: pass max_position_embeddings= to derive it")
    if rope_type == "longrope" and params.get("factor") is None and params.get("attention_factor") is None:
        raise ValueError("rope_type 'longrope' has neither factor nor attention_factor: pass max_position_embeddings=")
    return HFRope(float(base), {"rope_type": rope_type, **params}, rotary_dim, mrope, _layout(whole))


def scaling_by_layer_type(config: Mapping, max_position_embeddings: Optional[int] = None) -> dict[str, Optional[HFRope]]:
    """:func:`scaling_from_hf` for every layer type of a config: ``{layer type: HFRope}``.

    Gemma 2/3-style configs give one rope per layer type (Gemma 3: ``"full_attention"`` with
    ``rope_theta`` and its scaling, ``"sliding_attention"`` with ``rope_local_base_freq``); a layer
    type whose rope is ``null`` (a layer without position) maps to ``None``. A config with one rope
    for every layer gives it for each of its ``layer_types``, or as ``{"full_attention": rope}``
    where it names none (transformers' key for a flat rope). Which layer has which type is the
    config's ``layer_types`` list.

    Raises:
        TypeError, ValueError: as :func:`scaling_from_hf`.
    """
    config = as_mapping(config)
    inner = _text_config(config)
    per_layer = _per_layer_type(inner)
    if per_layer is None:
        rope = scaling_from_hf(config, max_position_embeddings)
        return {t: rope for t in dict.fromkeys(inner.get("layer_types") or ["full_attention"])}
    return {t: None if per_layer[t] is None else scaling_from_hf(config, max_position_embeddings, layer_type=t)
            for t in per_layer}


def _rotary_dim(rope: Mapping, whole: Mapping) -> Optional[int]:
    """``int(head_dim * partial_rotary_factor)``, Hugging Face's rotated dims; ``None`` without a head size."""
    factor = _agreed("partial_rotary_factor", rope, whole)
    head_dim = whole.get("head_dim")
    mla = whole.get("qk_rope_head_dim")
    if mla is not None:  # multi-head latent attention: the rotary head is separate (transformers sets head_dim to it)
        if factor is not None and factor != 1 and head_dim is not None and int(head_dim * factor) != mla:
            raise ValueError(
                f"qk_rope_head_dim={mla} disagrees with head_dim={head_dim} x partial_rotary_factor={factor}; "
                "give one rotary size"
            )
        return mla
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
