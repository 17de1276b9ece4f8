"""posenc's reading of published checkpoints' RoPE against transformers', on the corpus of real
``config.json`` files in ``tests/hf_configs/`` (see its README for where each comes from).

For every file and every layer type: the frequencies and attention scale posenc computes from
``scaling_by_layer_type`` equal those of ``transformers.modeling_rope_utils`` for the same config, at
several lengths (to fp32 rounding; bit for bit with ``arithmetic="transformers"``); the raw ``config.json`` dict is read the same as the transformers config object, or
refused with a message naming what is missing (``RAW_REFUSED``: keys the file leaves to the model
class's defaults, which posenc does not guess).

Runs only where `transformers` is installed (it is not a dependency of posenc); skipped otherwise.
"""

import copy
import json
from pathlib import Path

import pytest
import torch

from posenc.rope import inverse_frequencies, scaling_by_layer_type

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

CORPUS = Path(__file__).parent / "hf_configs"
FILES = sorted(p.name for p in CORPUS.glob("*.json"))
RTOL = 3e-7  # about 2 fp32 ulps: transformers rounds after each fp32 step, posenc once from fp64

#: model types whose hub code is not in transformers (``trust_remote_code``): read with the
#: architecture their ``architectures`` entry names, which transformers has
REMOTE_CODE = {"kimi_k2": "deepseek_v3", "internlm2": "llama"}

#: files whose raw config.json leaves a rope key to the model class's default that posenc does
#: not know (posenc.rope.hf_config.MODEL_TYPE_DEFAULTS): refused, naming the key
RAW_REFUSED: dict[str, str] = {}


def load(name: str) -> dict:
    entry = json.loads((CORPUS / name).read_text())
    assert {"model", "source", "config"} <= set(entry), name
    return entry["config"]


def hf_config(raw: dict):
    """transformers' config object of a corpus file (its text config for a multimodal one)."""
    raw = copy.deepcopy(raw)
    model_type = raw.pop("model_type")
    config = AutoConfig.for_model(REMOTE_CODE.get(model_type, model_type), **raw)
    return config.get_text_config()


def hf_frequencies(config, layer_type, seq_len):
    """transformers' frequencies and attention scale; the default type through its linear scaling at
    factor 1 (the same reading of the head size and base, then a division by 1)."""
    params = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        config = copy.deepcopy(config)
        target = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
        target.update(rope_type="linear", factor=1.0)
        rope_type = "linear"
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len, layer_type=layer_type)


def test_the_corpus_is_large_and_documented():
    assert len(FILES) >= 30
    readme = (CORPUS / "README.md").read_text()
    assert all(name in readme for name in FILES)


def test_gpt_j_reads_its_rotary_dim_and_the_base_of_its_code():
    # GPT-J states no rope at all: 64 of its 256 head dims rotate (rotary_dim), base 10000 fixed in
    # its modelling code (create_sinusoidal_positions), interleaved layout
    from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

    raw = load("gpt-j-6b.json")
    assert scaling_by_layer_type(raw) == scaling_by_layer_type(hf_config(raw)) == {"full_attention": (10000.0, None, 64)}
    inv, _ = inverse_frequencies(64, 10000.0)
    table = create_sinusoidal_positions(4096, 64)  # (T, R): sin of the 32 pairs, then cos
    angles = torch.arange(4096)[:, None].float() * inv
    torch.testing.assert_close(torch.cat([angles.sin(), angles.cos()], -1), table, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", [f for f in FILES if f != "gpt-j-6b.json"])
def test_posenc_computes_what_transformers_computes(name):
    raw = load(name)
    config = hf_config(raw)
    ours = scaling_by_layer_type(config)
    nested = bool(config.nested_rope_parameter_keys(config.rope_parameters))
    max_len = config.max_position_embeddings
    assert ours and all(rope is not None for rope in ours.values())
    for layer_type, rope in ours.items():
        key = layer_type if nested else None
        params = config.rope_parameters if key is None else config.rope_parameters[key]
        for seq_len in sorted({1, 4096, 4097, max_len}):
            inv_hf, scale_hf = hf_frequencies(config, key, seq_len)
            inv, scale = inverse_frequencies(rope.rotary_dim, rope.base, rope.scaling, seq_len=seq_len)
            assert inv.shape == inv_hf.shape, (layer_type, seq_len)
            torch.testing.assert_close(inv, inv_hf.float(), rtol=RTOL, atol=0, msg=f"{layer_type} at {seq_len}")
            assert scale == pytest.approx(float(scale_hf), rel=1e-12), (layer_type, seq_len)
            # in transformers' arithmetic: its inv_freq bit for bit
            fp32, _ = inverse_frequencies(rope.rotary_dim, rope.base, rope.scaling, seq_len=seq_len,
                                          arithmetic="transformers")
            assert torch.equal(fp32, inv_hf.float()), (layer_type, seq_len)
        sections = params.get("mrope_section")
        assert (rope.mrope or {}).get("sections") == (None if sections is None else tuple(sections))


@pytest.mark.parametrize("name", FILES)
def test_the_raw_config_json_is_read_as_the_config_object_or_refused_by_name(name):
    raw = load(name)
    if name in RAW_REFUSED:
        with pytest.raises(ValueError, match=RAW_REFUSED[name]):
            scaling_by_layer_type(copy.deepcopy(raw))
        return
    from_raw, from_object = scaling_by_layer_type(copy.deepcopy(raw)), scaling_by_layer_type(hf_config(raw))
    if set(from_raw) == {"full_attention"} and set(from_object) != set(from_raw):
        # one rope for every layer; transformers' object also names the layer types its class derives
        assert all(rope == from_raw["full_attention"] for rope in from_object.values())
    else:
        assert from_raw == from_object


@pytest.mark.parametrize("name", FILES)
def test_every_corpus_model_has_a_known_layout(name):
    # interleaved pairs: GPT-J (rotate_every_two), DeepSeek-V2 and Llama 4 (complex products), DeepSeek-V3 and
    # Kimi-K2 (rope_interleave); every other corpus model rotates with transformers' rotate_half
    interleaved = name.startswith(("gpt-j", "deepseek", "kimi", "llama-4"))
    ropes = scaling_by_layer_type(load(name))
    assert {rope.layout for rope in ropes.values()} == {"interleaved" if interleaved else "half"}


def test_llama4_rotates_interleaved_pairs_as_its_complex_product():
    # Llama 4 multiplies (x_2i + i x_2i+1) by e^(i m θ_i): posenc's "interleaved" layout, element for element
    from posenc.rope import apply_rope, rope_cos_sin
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding, apply_rotary_emb

    raw = load("llama-4-scout-17b-16e.json")
    config = hf_config(raw)
    rope = scaling_by_layer_type(raw)["full_attention"]
    emb = Llama4TextRotaryEmbedding(config=config)
    positions = torch.arange(0, 4096, 97)[None]  # (1, T)
    freqs_cis = emb(torch.zeros(1), positions)  # (1, T, R/2) complex
    q = torch.randn(1, positions.shape[1], 2, 128)  # (B, T, H, D), Llama 4's order
    q_hf, _ = apply_rotary_emb(q, q, freqs_cis)
    inv, scale = inverse_frequencies(rope.rotary_dim, rope.base, rope.scaling, arithmetic="transformers")
    cos, sin = rope_cos_sin(positions[0], inv, scale, arithmetic="transformers")  # (T, R/2)
    ours = apply_rope(q.transpose(1, 2), cos, sin, layout=rope.layout).transpose(1, 2)
    torch.testing.assert_close(ours, q_hf, atol=1e-5, rtol=1e-5)


def test_deepseek_v3_interleaved_rope_gives_transformers_scores():
    from posenc.rope import apply_rope, rope_cos_sin
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3RotaryEmbedding,
        apply_rotary_pos_emb_interleave,
    )

    raw = load("deepseek-v3.json")
    rope = scaling_by_layer_type(raw)["full_attention"]
    assert rope.layout == "interleaved" and rope.rotary_dim == 64
    config = hf_config(raw)
    emb = DeepseekV3RotaryEmbedding(config=config)
    positions = torch.arange(0, 4096, 61)[None]
    cos_hf, sin_hf = emb(torch.zeros(1), positions)  # (1, T, 64)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, positions.shape[1], 64, generator=g), torch.randn(1, 2, positions.shape[1], 64, generator=g)
    q_hf, k_hf = apply_rotary_pos_emb_interleave(q, k, cos_hf, sin_hf)  # its output is de-interleaved
    inv, scale = inverse_frequencies(rope.rotary_dim, rope.base, rope.scaling, arithmetic="transformers")
    cos, sin = rope_cos_sin(positions[0], inv, scale, arithmetic="transformers")
    q_ours, k_ours = apply_rope(q, cos, sin, rope.layout), apply_rope(k, cos, sin, rope.layout)
    torch.testing.assert_close(q_ours @ k_ours.transpose(-1, -2), q_hf @ k_hf.transpose(-1, -2), atol=1e-4, rtol=1e-5)
    # the other layout, which a reader who assumed Llama's would use, gives other scores
    q_half, k_half = apply_rope(q, cos, sin, "half"), apply_rope(k, cos, sin, "half")
    assert (q_half @ k_half.transpose(-1, -2) - q_hf @ k_hf.transpose(-1, -2)).abs().max() > 1
