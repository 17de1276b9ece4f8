"""Parity of posenc.rope with Hugging Face's RoPE code, which Llama-style (half layout) and GPT-J
(interleaved layout) checkpoints are run with.

Runs only where `transformers` is installed (it is not a dependency of posenc); skipped otherwise.
"""

import inspect

import pytest
import torch

from posenc.rope import FP64_ANGLES_FROM, apply_rope, inverse_frequencies, rope_cos_sin

transformers = pytest.importorskip("transformers")


def llama_rotary(head_dim: int, n_head: int, theta: float, device):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    kwargs = dict(hidden_size=head_dim * n_head, num_attention_heads=n_head, max_position_embeddings=8192)
    try:  # transformers >= 5 keeps theta in rope_parameters
        config = LlamaConfig(**kwargs, rope_parameters={"rope_type": "default", "rope_theta": theta})
    except TypeError:
        config = LlamaConfig(**kwargs, rope_theta=theta)
    if getattr(config, "rope_theta", theta) != theta and getattr(config, "rope_parameters", {}).get("rope_theta") != theta:
        config.rope_theta = theta
    return LlamaRotaryEmbedding(config=config).to(device)


@pytest.mark.parametrize("head_dim,theta", [(64, 10000.0), (128, 500000.0)])
def test_llama_frequencies_and_cos_sin(head_dim, theta, device):
    emb = llama_rotary(head_dim, 4, theta, device)
    inv, scale = inverse_frequencies(head_dim, theta, device=device)
    assert torch.equal(emb.inv_freq.float(), inv) and scale == 1.0
    pos = torch.arange(FP64_ANGLES_FROM, device=device)
    x = torch.zeros(1, FP64_ANGLES_FROM, head_dim, device=device)
    cos_hf, sin_hf = emb(x, pos[None])  # (1, T, D): the half-layout cos/sin, duplicated
    cos, sin = rope_cos_sin(pos, inv)
    torch.testing.assert_close(cos_hf[0], torch.cat([cos, cos], -1), atol=2e-6, rtol=0)  # same fp32 product; cos kernels may differ by an ulp
    torch.testing.assert_close(sin_hf[0], torch.cat([sin, sin], -1), atol=2e-6, rtol=0)


def test_llama_apply_rotary_pos_emb_is_the_half_layout(device):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 50, 64, device=device), torch.randn(2, 4, 50, 64, device=device)
    cos, sin = rope_cos_sin(torch.arange(100, 150, device=device), inverse_frequencies(64, device=device)[0])
    q_hf, k_hf = apply_rotary_pos_emb(q, k, torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])
    torch.testing.assert_close(apply_rope(q, cos, sin, "half"), q_hf, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(apply_rope(k, cos, sin, "half"), k_hf, atol=1e-6, rtol=1e-6)
    # in bf16, Hugging Face rotates in bf16 with bf16 cos/sin; posenc rotates in fp32 and rounds once
    qb = q.to(torch.bfloat16)
    exact = apply_rope(qb.double(), cos.double(), sin.double(), "half")
    ours = apply_rope(qb, cos, sin, "half").double()
    theirs = apply_rotary_pos_emb(qb, qb, torch.cat([cos, cos], -1)[None].to(torch.bfloat16), torch.cat([sin, sin], -1)[None].to(torch.bfloat16))[0].double()
    assert (ours - exact).abs().mean() < (theirs - exact).abs().mean()


def test_gptj_rotary_is_the_interleaved_layout(device):
    from transformers.models.gptj import modeling_gptj

    torch.manual_seed(1)
    rotary_dim, T = 32, 40
    x = torch.randn(2, T, 4, 48, device=device)  # GPT-J: (B, T, H, D), partial rotary on the first 32 dims
    table = modeling_gptj.create_sinusoidal_positions(2048, rotary_dim).to(device)  # (N, rotary_dim): sin | cos
    sincos = table[torch.arange(T, device=device)][None]  # (1, T, rotary_dim)
    sin_hf, cos_hf = torch.split(sincos, rotary_dim // 2, dim=-1)  # (1, T, rotary_dim / 2) each
    if "repeat_interleave" not in inspect.getsource(modeling_gptj.apply_rotary_pos_emb):
        # older transformers expand sin/cos to (1, T, 1, rotary_dim) before calling it; newer ones inside it
        sin_hf = torch.repeat_interleave(sin_hf[:, :, None, :], 2, 3)
        cos_hf = torch.repeat_interleave(cos_hf[:, :, None, :], 2, 3)
    theirs = torch.cat([modeling_gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin_hf, cos_hf), x[..., rotary_dim:]], -1)
    cos, sin = rope_cos_sin(torch.arange(T, device=device), inverse_frequencies(rotary_dim, device=device)[0])
    ours = apply_rope(x.transpose(1, 2), cos, sin, "interleaved").transpose(1, 2)  # (B, H, T, D) -> back
    torch.testing.assert_close(ours, theirs, atol=2e-6, rtol=1e-6)


def phi2_rotary(device):
    """transformers' rotary embedding of a Phi-2-shaped config: head 80, partial_rotary_factor 0.4 (R = 32)."""
    from transformers import PhiConfig
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

    config = PhiConfig(hidden_size=160, num_attention_heads=2, partial_rotary_factor=0.4, max_position_embeddings=2048)
    return PhiRotaryEmbedding(config=config).to(device)


def test_partial_rotary_full_width_cos_sin_are_refused_and_the_half_width_matches(device):
    # transformers hands a partial-rotary model cos/sin of width R (the two halves repeated); posenc
    # takes R/2. Passed as they are they would rotate 2R of the head's dims: refused, with the fix.
    from transformers.models.phi.modeling_phi import apply_rotary_pos_emb

    emb = phi2_rotary(device)
    pos = torch.arange(7, 40, device=device)
    q = torch.randn(1, 2, pos.numel(), 80, device=device, generator=None)
    cos_hf, sin_hf = emb(q, pos[None])  # (1, T, 32)
    assert cos_hf.shape[-1] == 32
    with pytest.raises(ValueError, match=r"cos/sin of width 32 repeat themselves.*cos\[..., :16\]"):
        apply_rope(q, cos_hf[:, None], sin_hf[:, None])
    ours = apply_rope(q, cos_hf[:, None, :, :16], sin_hf[:, None, :, :16])
    q_rot = apply_rotary_pos_emb(q[..., :32], q[..., :32], cos_hf, sin_hf)[0]  # Phi rotates q[..., :R] itself
    torch.testing.assert_close(ours, torch.cat([q_rot, q[..., 32:]], -1), atol=1e-6, rtol=1e-6)
    # a table of all-zero angles is the identity at any width, and position 0 alone is accepted
    c0, s0 = emb(q[:, :, :1], torch.zeros(1, 1, dtype=torch.long, device=device))
    torch.testing.assert_close(apply_rope(q[:, :, :1], c0[:, None], s0[:, None]), q[:, :, :1])


def test_repeat_interleaved_cos_sin_are_refused(device):
    inv, _ = inverse_frequencies(16, device=device)
    c, s = rope_cos_sin(torch.arange(3, 9, device=device), inv)  # (6, 8)
    x = torch.randn(2, 6, 64, device=device)
    with pytest.raises(ValueError, match="repeat themselves"):
        apply_rope(x, c.repeat_interleave(2, -1), s.repeat_interleave(2, -1), "interleaved")
    apply_rope(x, c, s, "interleaved")  # the (..., R/2) table of the same angles is taken


def test_full_width_cos_sin_are_refused_when_half_the_head_rotates(device):
    # partial_rotary_factor 0.5: transformers' table has width R = D/2, the width of posenc's full rotary
    from transformers import PhiConfig
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

    emb = PhiRotaryEmbedding(config=PhiConfig(hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.5)).to(device)
    q = torch.randn(1, 4, 6, 16, device=device)
    cos, sin = emb(q, torch.arange(6, device=device)[None])  # (1, 6, 8)
    with pytest.raises(ValueError, match="repeat themselves"):
        apply_rope(q, cos[:, None], sin[:, None])
    apply_rope(q, cos[:, None, :, :4], sin[:, None, :, :4])  # the half-width table is taken
