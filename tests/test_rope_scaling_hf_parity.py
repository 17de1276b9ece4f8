"""Parity of the RoPE scalings with Hugging Face's ``transformers.modeling_rope_utils``: for published
checkpoints' RoPE settings (config.json excerpts; the LongRoPE factor lists are synthetic, of the
published lengths), ``scaling_from_hf`` + ``inverse_frequencies`` give the frequencies and attention
scale transformers computes for the same config, read from the raw config.json dict and from the
transformers config object; and at the length where the dynamic and LongRoPE frequencies switch,
transformers' rotary modules switch at the same ``seq_len``.

Runs only where `transformers` is installed (it is not a dependency of posenc); skipped otherwise.
"""

import copy
import random

import pytest
import torch

from posenc.rope import FP64_ANGLES_FROM, inverse_frequencies, rope_cos_sin, scaling_by_layer_type, scaling_from_hf

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, Phi3Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

RTOL = 3e-7  # about 2 fp32 ulps: transformers rounds after each fp32 step, posenc once from fp64
#: transformers' side of every comparison runs on the CPU, the reference: on CUDA it computes the frequencies
#: with the GPU's fp32 pow, a few ulps away from its CPU result (6.6e-7 relative on an H100), whereas posenc
#: computes them in fp64 on any device and rounds once. posenc runs on ``device``.
HF_DEVICE = "cpu"


def factors(n: int, seed: int, high: float) -> list[float]:
    rng = random.Random(seed)
    return sorted(round(1.0 + (high - 1.0) * rng.random(), 4) for _ in range(n))


def entry(cls, heads: dict, theta, max_len: int, rope_scaling, **extra) -> tuple:
    """(config class, a config.json excerpt): the head sizes, RoPE's keys and the model's length."""
    return cls, {**heads, "vocab_size": 32, "rope_theta": theta, "max_position_embeddings": max_len,
                 "rope_scaling": rope_scaling, **extra}


H128 = {"hidden_size": 4096, "num_attention_heads": 32}
H64 = {"hidden_size": 4096, "num_attention_heads": 64}
PHI3 = {"hidden_size": 3072, "num_attention_heads": 32}  # head_dim 96
YARN_4K = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
CONFIGS = {  # name -> (config class, config.json excerpt)
    "llama2-default": entry(LlamaConfig, H128, 10000.0, 4096, None),
    "longchat-linear": entry(LlamaConfig, H128, 10000.0, 16384, {"type": "linear", "factor": 8.0}),
    "dynamic": entry(LlamaConfig, H128, 10000.0, 2048, {"type": "dynamic", "factor": 2.0}),
    "llama3.1": entry(LlamaConfig, H128, 500000.0, 131072, {
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        "rope_type": "llama3"}),
    "qwen2.5-yarn": entry(LlamaConfig, {"hidden_size": 3584, "num_attention_heads": 28}, 1e6, 131072, {
        "factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}),
    "qwen3-yarn-head-dim": entry(LlamaConfig, {"hidden_size": 1024, "num_attention_heads": 16, "head_dim": 128}, 1e6,
                                 131072, {**YARN_4K, "original_max_position_embeddings": 32768}),
    "deepseek-v3-yarn": entry(LlamaConfig, H64, 10000.0, 163840, {
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"}),
    "yarn-mscale-ratio": entry(LlamaConfig, H64, 10000.0, 163840, {
        "factor": 40, "mscale": 0.707, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
        "type": "yarn"}),
    "gpt-oss-yarn-untruncated": entry(LlamaConfig, {"hidden_size": 2880, "num_attention_heads": 64, "head_dim": 64},
                                      150000, 131072, {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
        "rope_type": "yarn", "truncate": False}),
    "yarn-factor-from-lengths": entry(LlamaConfig, H128, 10000.0, 32768, {**YARN_4K, "factor": None}),
    "yarn-attention-factor": entry(LlamaConfig, H128, 10000.0, 16384, {**YARN_4K, "attention_factor": 0.8}),
    "yarn-partial-rotary": entry(LlamaConfig, H128, 10000.0, 16384, YARN_4K, partial_rotary_factor=0.5),
    "phi3-mini-128k-longrope": entry(Phi3Config, PHI3, 10000.0, 131072, {
        "type": "longrope", "short_factor": factors(48, 0, 1.2), "long_factor": factors(48, 1, 60.0)},
        original_max_position_embeddings=4096),
    "phi4-mini-longrope-partial": entry(Phi3Config, {"hidden_size": 3072, "num_attention_heads": 24}, 10000.0,
                                        131072, {
        "type": "longrope", "short_factor": factors(48, 2, 1.2), "long_factor": factors(48, 3, 40.0)},
        original_max_position_embeddings=4096, partial_rotary_factor=0.75),
}


def hf_config(name: str):
    cls, raw = CONFIGS[name]
    return cls(**copy.deepcopy(raw))


def hf_frequencies(config, device, seq_len):
    rope_type = config.rope_parameters.get("rope_type", "default") if hasattr(config, "rope_parameters") else (
        (config.rope_scaling or {}).get("rope_type", (config.rope_scaling or {}).get("type", "default")))
    if rope_type == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        emb = LlamaRotaryEmbedding(config=config).to(device)
        return emb.inv_freq, emb.attention_scaling
    return ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=seq_len)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_frequencies_and_attention_scale_match_transformers(name, device):
    config = hf_config(name)
    from_json = scaling_from_hf(copy.deepcopy(CONFIGS[name][1]))  # the raw config.json dict
    # and the transformers config object: the same reading (which also knows the model type, hence the layout)
    assert tuple(scaling_from_hf(config)) == tuple(from_json) and scaling_from_hf(config).layout == "half"
    base, scaling, rotary_dim = from_json
    max_len = CONFIGS[name][1]["max_position_embeddings"]
    for seq_len in (1, 100, 2048, 2049, 4096, 4097, max_len):
        inv_hf, scale_hf = hf_frequencies(config, HF_DEVICE, seq_len)
        inv, scale = inverse_frequencies(rotary_dim, base, scaling, seq_len=seq_len, device=device)
        assert inv.shape == inv_hf.shape and inv.device.type == torch.device(device).type
        torch.testing.assert_close(inv.cpu(), inv_hf.float(), rtol=RTOL, atol=0)
        assert scale == pytest.approx(float(scale_hf), rel=1e-12)


@pytest.mark.parametrize("n", [1000, 2048, 2049, 6000])
def test_dynamic_module_switches_at_the_same_length(n, device):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = hf_config("dynamic")  # max_position_embeddings 2048
    emb = LlamaRotaryEmbedding(config=config).to(HF_DEVICE)
    positions = torch.arange(n)
    cos_hf, sin_hf = emb(torch.zeros(1, n, 128), positions[None])  # (1, n, 128): half layout, doubled
    base, scaling, rotary_dim = scaling_from_hf(CONFIGS["dynamic"][1])
    inv, scale = inverse_frequencies(rotary_dim, base, scaling, seq_len=n, device=device)  # n: largest position + 1
    torch.testing.assert_close(emb.inv_freq.float(), inv.cpu(), rtol=1e-6, atol=0)  # transformers: its base as fp32
    near = positions[:FP64_ANGLES_FROM].to(device)  # beyond, posenc's angles are fp64 and transformers' fp32
    cos, sin = (t.cpu() for t in rope_cos_sin(near, inv, scale))
    torch.testing.assert_close(cos_hf[0, : len(near)], torch.cat([cos, cos], -1), atol=2e-5, rtol=0)
    torch.testing.assert_close(sin_hf[0, : len(near)], torch.cat([sin, sin], -1), atol=2e-5, rtol=0)


@pytest.mark.parametrize("n", [4096, 4097])
def test_longrope_module_switches_factors_at_the_same_length(n, device):
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    config = hf_config("phi3-mini-128k-longrope")  # original length 4096
    emb = Phi3RotaryEmbedding(config=config).to(HF_DEVICE)
    emb(torch.zeros(1, n, 96), torch.arange(n)[None])  # updates emb.inv_freq for length n
    base, scaling, rotary_dim = scaling_from_hf(CONFIGS["phi3-mini-128k-longrope"][1])
    inv, scale = inverse_frequencies(rotary_dim, base, scaling, seq_len=n, device=device)
    torch.testing.assert_close(emb.inv_freq.float(), inv.cpu(), rtol=RTOL, atol=0)
    assert scale == pytest.approx(emb.attention_scaling, rel=1e-12)
    other, _ = inverse_frequencies(rotary_dim, base, scaling, seq_len=8193 - n, device=device)  # the other factor set
    assert not torch.allclose(emb.inv_freq.float(), other.cpu())


# ----------------------------------------------------------------- configs posenc once read wrong or refused


def _hf_rotary(module: str, cls: str, config):
    mod = __import__(f"transformers.models.{module}.modeling_{module}", fromlist=[cls])
    return getattr(mod, cls)(config=config).to(HF_DEVICE)


def test_deepseek_v3_rotates_its_decoupled_rope_head(device):
    # MLA: queries and keys have a 128-dim head without position and a 64-dim rotary head
    # (qk_rope_head_dim); hidden_size / num_attention_heads = 56 is neither
    from transformers import DeepseekV3Config

    raw = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64,
           "qk_nope_head_dim": 128, "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
           "max_position_embeddings": 163840, "rope_theta": 10000,
           "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "original_max_position_embeddings": 4096, "type": "yarn"}}
    config = DeepseekV3Config(**copy.deepcopy(raw))
    hf = scaling_from_hf(copy.deepcopy(raw))
    assert hf.rotary_dim == 64 and scaling_from_hf(config) == hf
    inv_hf, scale_hf = ROPE_INIT_FUNCTIONS["yarn"](config, HF_DEVICE)
    inv, scale = inverse_frequencies(hf.rotary_dim, hf.base, hf.scaling, device=device)
    torch.testing.assert_close(inv.cpu(), inv_hf.float(), rtol=RTOL, atol=0)
    assert scale == pytest.approx(float(scale_hf), rel=1e-12)


def test_yarn_needs_its_factor_key_and_derives_a_null_one():
    rope = {"rope_type": "yarn", "original_max_position_embeddings": 4096, "rope_theta": 1e4}
    with pytest.raises(ValueError, match="rope_type 'yarn' needs the key 'factor' in the rope dict"):
        scaling_from_hf(rope, 32768)  # transformers raises KeyError for the missing key
    assert scaling_from_hf({**rope, "factor": None}, 32768).scaling["factor"] == 8.0


@pytest.mark.parametrize("which", ["llama4-equal-freq-factors", "kimi-k2-equal-betas"])
def test_published_edge_settings_are_computed_as_transformers_computes_them(which, device):
    if which == "llama4-equal-freq-factors":  # Llama 4 Scout: low_freq_factor == high_freq_factor == 1
        raw = {"hidden_size": 5120, "num_attention_heads": 40, "head_dim": 128, "max_position_embeddings": 10485760,
               "rope_theta": 500000.0, "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                                                        "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    else:  # Kimi-K2: beta_fast == beta_slow == 1
        raw = {"hidden_size": 7168, "num_attention_heads": 64, "qk_rope_head_dim": 64, "max_position_embeddings": 131072,
               "rope_theta": 50000.0, "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                                                       "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                                       "type": "yarn"}}
    config = LlamaConfig(**{**copy.deepcopy(raw), "head_dim": raw.get("head_dim", raw.get("qk_rope_head_dim"))})
    base, scaling, rotary_dim = scaling_from_hf(copy.deepcopy(raw))
    inv_hf, scale_hf = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, HF_DEVICE)
    inv, scale = inverse_frequencies(rotary_dim, base, scaling, device=device)
    assert bool(torch.isfinite(inv_hf).all())  # no pair sits exactly at the cut-off in these configs
    torch.testing.assert_close(inv.cpu(), inv_hf.float(), rtol=RTOL, atol=0)
    assert scale == pytest.approx(float(scale_hf), rel=1e-12)


GEMMA3_4B_TEXT = {  # google/gemma-3-4b-it, text_config (the rope keys and the head)
    "model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
    "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024, "num_hidden_layers": 34,
}


def test_gemma3_reads_both_layer_types_and_refuses_to_guess(device):
    from transformers import Gemma3TextConfig

    raw = copy.deepcopy(GEMMA3_4B_TEXT)
    with pytest.raises(ValueError, match=r"a rope per layer type \(\['full_attention', 'sliding_attention'\]\)"):
        scaling_from_hf(raw)  # once it returned the global layers' rope for every layer
    by_type = scaling_by_layer_type({"model_type": "gemma3", "text_config": raw})  # the multimodal config.json
    assert by_type["full_attention"] == (1e6, {"rope_type": "linear", "factor": 8.0}, 256)
    assert by_type["sliding_attention"] == (1e4, None, 256)
    config = Gemma3TextConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    assert scaling_by_layer_type(config) == by_type  # transformers' config object: the same reading
    emb = _hf_rotary("gemma3", "Gemma3RotaryEmbedding", config)
    for layer_type, hf in by_type.items():
        inv, scale = inverse_frequencies(hf.rotary_dim, hf.base, hf.scaling, device=device)
        torch.testing.assert_close(inv.cpu(), getattr(emb, f"{layer_type}_inv_freq").float(), rtol=RTOL, atol=0)
        assert scale == getattr(emb, f"{layer_type}_attention_scaling")
    nested = {"model_type": "gemma3_text", "layer_types": config.layer_types, "head_dim": 256,
              "rope_parameters": config.rope_parameters}
    assert scaling_by_layer_type(nested) == by_type  # transformers' nested form, written out
    with pytest.raises(ValueError, match="layer_type='chunked' is not one of them"):
        scaling_from_hf(raw, layer_type="chunked")


def test_a_flat_rope_serves_every_layer_type():
    raw = {"hidden_size": 1024, "num_attention_heads": 8, "rope_theta": 1e4,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    assert scaling_by_layer_type(raw) == {"sliding_attention": (1e4, None, 128), "full_attention": (1e4, None, 128)}
    assert scaling_by_layer_type({**raw, "layer_types": None}) == {"full_attention": (1e4, None, 128)}
    assert scaling_from_hf(raw, layer_type="full_attention") == (1e4, None, 128)


def test_proportional_matches_transformers(device):
    from transformers.modeling_rope_utils import _compute_proportional_rope_parameters

    raw = {"hidden_size": 2048, "num_attention_heads": 8, "head_dim": 256, "max_position_embeddings": 131072,
           "rope_parameters": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                               "factor": 8.0}}
    hf = scaling_from_hf(copy.deepcopy(raw))
    assert hf.rotary_dim == 256 and hf.scaling == {"rope_type": "proportional", "factor": 8.0, "proportion": 0.25}
    config = LlamaConfig(**copy.deepcopy(raw))
    inv_hf, scale_hf = _compute_proportional_rope_parameters(config, HF_DEVICE)
    inv, scale = inverse_frequencies(hf.rotary_dim, hf.base, hf.scaling, device=device)
    torch.testing.assert_close(inv.cpu(), inv_hf.float(), rtol=RTOL, atol=0)
    assert int((inv == 0).sum()) == 128 - 32 and scale == scale_hf == 1.0


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_mrope_cos_sin_match_transformers(family, device):
    # three positions per token (temporal, height, width); pairs of each section turn with one of them
    from posenc.rope import mrope_cos_sin

    if family == "qwen2_vl":
        from transformers import Qwen2VLTextConfig as Config

        rope = {"type": "mrope", "mrope_section": [16, 24, 24]}
        module, cls = "qwen2_vl", "Qwen2VLRotaryEmbedding"
    else:
        from transformers import Qwen3VLTextConfig as Config

        rope = {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}
        module, cls = "qwen3_vl", "Qwen3VLTextRotaryEmbedding"
    raw = {"hidden_size": 1024, "num_attention_heads": 8, "head_dim": 128, "max_position_embeddings": 32768,
           "rope_theta": 1e6, "rope_scaling": rope}
    hf = scaling_from_hf(copy.deepcopy(raw))
    assert hf.mrope == {"sections": tuple(rope["mrope_section"]), "interleaved": family == "qwen3_vl"}
    base, scaling, rotary_dim = hf  # unpacks as before; mrope is an attribute
    emb = _hf_rotary(module, cls, Config(**copy.deepcopy(raw)))
    g = torch.Generator().manual_seed(0)
    # (3, B, T): an image's frames, rows and columns; below FP64_ANGLES_FROM, where both compute fp32 angles
    positions = torch.randint(0, FP64_ANGLES_FROM, (3, 2, 40), generator=g)
    cos_hf, sin_hf = emb(torch.zeros(1, dtype=torch.float32), positions)  # (B, T, R): the two halves repeated
    inv, scale = inverse_frequencies(rotary_dim, base, scaling, device=device)
    cos, sin = mrope_cos_sin(positions.to(device), inv, **hf.mrope, attention_scale=scale)
    torch.testing.assert_close(torch.cat([cos, cos], -1).cpu(), cos_hf, atol=2e-6, rtol=0)
    torch.testing.assert_close(torch.cat([sin, sin], -1).cpu(), sin_hf, atol=2e-6, rtol=0)
    # text tokens: three equal positions are plain RoPE, exactly (a check of the mathematics)
    text = torch.arange(100, 140, device=device)
    c_text, s_text = mrope_cos_sin(text.expand(3, -1), inv, **hf.mrope)
    c_plain, s_plain = rope_cos_sin(text, inv)
    assert torch.equal(c_text, c_plain) and torch.equal(s_text, s_plain)


@pytest.mark.parametrize("name", ["llama3.1", "qwen2.5-yarn", "longchat-linear"])
def test_transformers_arithmetic_reproduces_a_checkpoints_cos_sin_bit_for_bit(name, device):
    # checkpoints were trained with transformers' (and Meta's) fp32 frequencies and angles; posenc's
    # exact arithmetic is closer to the mathematics and a few milliradians away from them at 131k
    from posenc.rope import RotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = hf_config(name)
    base, scaling, rotary_dim = scaling_from_hf(copy.deepcopy(CONFIGS[name][1]))
    emb = LlamaRotaryEmbedding(config=config).to(HF_DEVICE)
    positions = torch.tensor([0, 1, 4095, 4096, 50000, 131071])
    cos_hf, sin_hf = emb(torch.zeros(1), positions[None])  # (1, T, R)
    exact = RotaryEmbedding(rotary_dim, 131072, base, scaling=scaling).to(device)
    same = RotaryEmbedding(rotary_dim, 131072, base, scaling=scaling, arithmetic="transformers").to(device)
    c, s = same.cos_sin(positions.to(device))
    assert torch.equal(torch.cat([c, c], -1).cpu(), cos_hf[0]) and torch.equal(torch.cat([s, s], -1).cpu(), sin_hf[0])
    c_exact, _ = exact.cos_sin(positions.to(device))
    gap = (c_exact.cpu() - c.cpu()).abs()
    assert gap[:3].max() < 1e-6 < gap[-1].max() < 1e-2  # equal below 4096; apart, slightly, far out
    with pytest.raises(ValueError, match=r"arithmetic must be one of \('exact', 'transformers'\), got 'fp16'"):
        RotaryEmbedding(rotary_dim, 16, base, arithmetic="fp16")


def test_longrope_on_a_model_shorter_than_its_original_length(device):
    # transformers derives factor = max_position_embeddings / original = 1/16 and an attention scale of 1
    raw = {"hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 256,
           "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
           "rope_scaling": {"type": "longrope", "short_factor": factors(48, 5, 1.2), "long_factor": factors(48, 6, 9.0)}}
    config = Phi3Config(**copy.deepcopy(raw))
    base, scaling, rotary_dim = scaling_from_hf(copy.deepcopy(raw))
    inv_hf, scale_hf = ROPE_INIT_FUNCTIONS["longrope"](config, HF_DEVICE, seq_len=100)
    inv, scale = inverse_frequencies(rotary_dim, base, scaling, seq_len=100, device=device)
    torch.testing.assert_close(inv.cpu(), inv_hf.float(), rtol=RTOL, atol=0)
    assert scale == scale_hf == 1.0
