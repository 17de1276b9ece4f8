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

from posenc.rope import FP64_ANGLES_FROM, inverse_frequencies, rope_cos_sin, scaling_from_hf

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
    assert scaling_from_hf(config) == from_json  # and the transformers config object: the same reading
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
