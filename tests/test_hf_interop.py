"""posenc swapped into tiny random-weight transformers models reproduces their logits.

For each model family (Llama with llama3 scaling and grouped-query attention, Qwen2 with YaRN,
GPT-NeoX with partial rotary, Phi-3 with LongRoPE across its original length, Gemma 3 with local and
global layers, DeepSeek-V3 with its decoupled interleaved rotary head, BLOOM with ALiBi, T5 with its
bucket bias) the model's logits with posenc's position code (and attention function) equal the
model's own, at positions past the original length where a scaling changes the frequencies, and
with a padded batch.

Runs only where `transformers` is installed (it is not a dependency of posenc); skipped otherwise.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf import (  # noqa: E402
    HFRotaryEmbedding,
    bloom_alibi_tensor,
    register_attention,
    use_posenc_t5_bias,
)

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=101)
ATOL = 2e-5  # fp32 rounding: the attention kernels differ; cos/sin are bit for bit


def _logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits


def _swap_and_compare(model, rotary_owner, ids, **kwargs):
    """Logits of ``model`` as it is, then with posenc's rotary embedding and attention function."""
    model.eval()
    reference = _logits(model, ids, **kwargs)
    rotary_owner.rotary_emb = HFRotaryEmbedding(model.config)
    model.set_attn_implementation(register_attention("posenc"))
    ours = _logits(model, ids, **kwargs)
    torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)
    return reference


def _ids(T=24, B=2, seed=0):
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def _far_positions(start, T=24, B=2):
    return (torch.arange(T) + start).expand(B, T)


def test_llama_with_llama3_scaling_and_gqa():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**TINY, max_position_embeddings=131072, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    model = LlamaForCausalLM(config)
    _swap_and_compare(model, model.model, _ids(), position_ids=_far_positions(20000))


def test_llama_with_a_left_padded_batch():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**TINY, max_position_embeddings=4096))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    model.eval()
    reference = _logits(model, _ids(seed=1), attention_mask=mask, position_ids=positions)
    model.model.rotary_emb = HFRotaryEmbedding(model.config)
    model.set_attn_implementation(register_attention("posenc"))
    ours = _logits(model, _ids(seed=1), attention_mask=mask, position_ids=positions)
    keep = mask.bool()  # a padding query sees no key: its output is a convention (posenc: uniform, finite)
    torch.testing.assert_close(ours[keep], reference[keep], atol=ATOL, rtol=0)
    assert bool(torch.isfinite(ours).all())


def test_qwen2_with_yarn():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(2)
    config = Qwen2Config(**TINY, max_position_embeddings=131072, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768})
    model = Qwen2ForCausalLM(config)
    _swap_and_compare(model, model.model, _ids(seed=2), position_ids=_far_positions(100000))


def test_gpt_neox_with_partial_rotary():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(3)
    config = GPTNeoXConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                           vocab_size=101, max_position_embeddings=2048, rotary_pct=0.25)
    model = GPTNeoXForCausalLM(config)
    assert HFRotaryEmbedding(config).ropes["full_attention"].rotary_dim == 4  # a quarter of the 16-dim head
    _swap_and_compare(model, model.gpt_neox, _ids(seed=3))


@pytest.mark.parametrize("start", [0, 4090])
def test_phi3_with_longrope_on_both_sides_of_its_original_length(start):
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(4)
    half = 8  # head 16
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.05 * i for i in range(half)],
            "long_factor": [1.0 + 3.0 * i for i in range(half)]}
    config = Phi3Config(**TINY, pad_token_id=0, max_position_embeddings=131072, original_max_position_embeddings=4096,
                        rope_parameters=rope)
    model = Phi3ForCausalLM(config)
    _swap_and_compare(model, model.model, _ids(seed=4), position_ids=_far_positions(start))


def test_gemma3_local_and_global_layers():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(5)
    config = Gemma3TextConfig(**{**TINY, "num_hidden_layers": 3}, head_dim=16, max_position_embeddings=131072,
                              sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                               "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                  "rope_theta": 1e6}})
    model = Gemma3ForCausalLM(config)
    _swap_and_compare(model, model.model, _ids(seed=5), position_ids=_far_positions(3000))


def test_deepseek_v3_decoupled_interleaved_rope():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(6)
    config = DeepseekV3Config(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=4, vocab_size=101, kv_lora_rank=16,
                              q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                              n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                              first_k_dense_replace=1, max_position_embeddings=163840, rope_parameters={
                                  "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0,
                                  "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                                  "original_max_position_embeddings": 4096})
    model = DeepseekV3ForCausalLM(config)
    rope = HFRotaryEmbedding(config).ropes["full_attention"]
    assert rope.rotary_dim == 8 and rope.layout == "interleaved"
    _swap_and_compare(model, model.model, _ids(seed=6), position_ids=_far_positions(50000))


def test_bloom_alibi():
    from transformers import BloomConfig, BloomForCausalLM
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    torch.manual_seed(7)
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[0, :3] = 0
    for heads in (4, 6, 12):  # a power of two and two that are not
        assert torch.equal(bloom_alibi_tensor(mask, heads, torch.float32), build_alibi_tensor(mask, heads, torch.float32))
    model = BloomForCausalLM(BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=101)).eval()
    reference = _logits(model, _ids(seed=7), attention_mask=mask)
    model.transformer.build_alibi_tensor = bloom_alibi_tensor
    torch.testing.assert_close(_logits(model, _ids(seed=7), attention_mask=mask), reference, atol=0, rtol=0)


def test_t5_bias():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(8)
    config = T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=101,
                      relative_attention_num_buckets=32, relative_attention_max_distance=128)
    model = T5ForConditionalGeneration(config).eval()
    for module in model.modules():  # non-zero tables (the decoder's default initialisation is random too)
        if getattr(module, "has_relative_attention_bias", False):
            torch.nn.init.normal_(module.relative_attention_bias.weight)
    src, tgt = _ids(T=40, seed=8), _ids(T=12, seed=9)
    reference = _logits(model, src, decoder_input_ids=tgt)
    assert use_posenc_t5_bias(model) == 2  # the encoder's first layer and the decoder's
    torch.testing.assert_close(_logits(model, src, decoder_input_ids=tgt), reference, atol=0, rtol=0)


def test_the_rotary_module_refuses_an_ambiguous_call():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(**TINY, head_dim=16)
    with pytest.raises(ValueError, match="a rope per layer type .* pass layer_type"):
        HFRotaryEmbedding(copy.deepcopy(config))(torch.zeros(1), torch.arange(3)[None])


# ----------------------------------------------------------------- the forms of cos/sin, and the checked swap


def _swap_checked_and_compare(model, ids, **kwargs):
    """Logits of ``model`` as it is, then after swap_rotary_embedding (checked) and posenc's attention."""
    from posenc.hf import swap_rotary_embedding

    model.eval()
    reference = _logits(model, ids, **kwargs)
    assert swap_rotary_embedding(model) >= 1
    ours = _logits(model, ids, **kwargs)
    torch.testing.assert_close(ours, reference, atol=ATOL, rtol=0)


def test_cohere_takes_its_repeat_interleaved_cos_sin():
    # Cohere's rotary module repeats each value twice in a row: the "cat" form gave other logits
    # (0.4 apart at this initialisation, only 3e-4 at the default one)
    from transformers import CohereConfig, CohereForCausalLM

    from posenc.hf import HFRotaryEmbedding

    torch.manual_seed(9)
    config = CohereConfig(**TINY, initializer_range=0.5)
    assert HFRotaryEmbedding(config).form == "interleave"
    model = CohereForCausalLM(config)
    _swap_checked_and_compare(model, _ids(seed=9))


def test_gpt_oss_takes_half_width_cos_sin_and_its_layer_types():
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(10)
    config = GptOssConfig(**TINY, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                          layer_types=["sliding_attention", "full_attention"], max_position_embeddings=131072,
                          rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                           "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                           "original_max_position_embeddings": 4096})
    model = GptOssForCausalLM(config)
    _swap_checked_and_compare(model, _ids(seed=10))  # its attention has sinks: keep its own


def test_a_scaled_rope_shared_by_two_layer_types():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(11)
    config = Qwen2Config(**TINY, layer_types=["sliding_attention", "full_attention"], use_sliding_window=True,
                         sliding_window=8, max_position_embeddings=131072,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                          "original_max_position_embeddings": 32768})
    model = Qwen2ForCausalLM(config)
    _swap_and_compare(model, model.model, _ids(seed=11), position_ids=_far_positions(90000))


def test_a_swap_that_would_change_the_model_is_refused(monkeypatch):
    import posenc.hf as hf
    from transformers import CohereConfig, CohereForCausalLM

    monkeypatch.setitem(hf.COS_SIN_FORM_BY_MODEL_TYPE, "cohere", "cat")  # as if posenc did not know Cohere's form
    model = CohereForCausalLM(CohereConfig(**TINY))
    original = model.model.rotary_emb
    with pytest.raises(ValueError, match="does not reproduce CohereRotaryEmbedding.*nothing was replaced"):
        hf.swap_rotary_embedding(model)
    assert model.model.rotary_emb is original


def test_models_with_complex_freqs_are_refused_by_name():
    from transformers import Llama4TextConfig

    with pytest.raises(ValueError, match="model_type 'llama4_text' takes complex freqs_cis"):
        HFRotaryEmbedding(Llama4TextConfig(**TINY, head_dim=16))


def test_dynamic_scaling_follows_transformers_bit_for_bit_as_the_length_grows():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(**TINY, max_position_embeddings=16, rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    theirs, ours = LlamaRotaryEmbedding(config), HFRotaryEmbedding(config)
    for n in (8, 17, 20, 64, 33, 100, 12, 5000):  # grows, stays, resets below 16, grows again
        ids = torch.arange(n)[None]
        for a, b in zip(ours(torch.zeros(1), ids), theirs(torch.zeros(1), ids)):
            assert torch.equal(a, b), n


def test_longt5_block_attention_is_refused_by_the_t5_bias_swap():
    from transformers import LongT5Config, LongT5ForConditionalGeneration

    from posenc.hf import use_posenc_t5_bias

    model = LongT5ForConditionalGeneration(LongT5Config(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                                        vocab_size=101, encoder_attention_type="local"))
    with pytest.raises(ValueError, match="compute_bias takes .*block_length.*nothing was changed"):
        use_posenc_t5_bias(model)
