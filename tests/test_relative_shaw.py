"""Tests of posenc.relative.shaw: Shaw et al. (2018) relative key and value vectors."""

import math

import pytest
import torch

from posenc.lab import LMConfig, TinyLM
from posenc.attention import attention, materialize_bias
from posenc.relative import ShawRelativePE, relative_positions, shaw_key_bias, shaw_relative_ids, shaw_value_term


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_ids_frozen_values_and_clipping():
    rel = torch.tensor([-5, -2, -1, 0, 1, 2, 7])
    assert shaw_relative_ids(rel, 2).tolist() == [0, 0, 1, 2, 3, 4, 4]
    assert shaw_relative_ids(rel.view(1, -1), 3).shape == (1, 7)


def naive_shaw(q, k, v, w_k, w_v, q_pos, k_pos, clip, causal=False):
    """Shaw et al. eqs. (3)-(6), one (b, h, i, j) at a time; a^K_ij = w_k[clip(j - i, -k, k) + k]."""
    B, H, T, D = q.shape
    S = k.shape[2]
    out = torch.zeros(B, H, T, v.shape[-1], dtype=q.dtype)
    logits = torch.full((B, H, T, S), float("-inf"), dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(S):
                    if causal and k_pos[j] > q_pos[i]:
                        continue
                    a = max(-clip, min(clip, int(k_pos[j] - q_pos[i]))) + clip
                    logits[b, h, i, j] = q[b, h, i] @ (k[b, h, j] + w_k[a]) / math.sqrt(D)
                alpha = torch.softmax(logits[b, h, i], dim=-1)
                for j in range(S):
                    a = max(-clip, min(clip, int(k_pos[j] - q_pos[i]))) + clip
                    out[b, h, i] += alpha[j] * (v[b, h, j] + w_v[a])
    return logits, out


def test_key_and_value_terms_match_the_per_pair_loop():
    q, k, v = rnd(2, 2, 4, 6, seed=1), rnd(2, 2, 7, 6, seed=2), rnd(2, 2, 7, 6, seed=3)
    w_k, w_v = rnd(5, 6, seed=4), rnd(5, 6, seed=5)
    q_pos, k_pos = torch.arange(3, 7), torch.arange(7)
    ids = shaw_relative_ids(relative_positions(q_pos, k_pos), 2)
    logits, out = naive_shaw(q, k, v, w_k, w_v, q_pos, k_pos, 2)
    fast = q @ k.transpose(-2, -1) / math.sqrt(6) + shaw_key_bias(q, w_k, ids)
    torch.testing.assert_close(fast, logits)
    alpha = torch.softmax(fast, -1)
    torch.testing.assert_close(alpha @ v + shaw_value_term(alpha, w_v, ids), out)


def test_method_inside_attention_matches_the_loop_with_a_causal_mask():
    m = ShawRelativePE(6, max_distance=2, num_layers=2, std=1.0).double()
    q, k, v = rnd(1, 3, 5, 6, seed=1), rnd(1, 3, 5, 6, seed=2), rnd(1, 3, 5, 6, seed=3)
    pos = torch.arange(5)
    bias = m.attention_bias(q, k, pos, pos, layer=1)
    out, w = attention(q, k, v, bias=bias, causal=True, return_weights=True)
    out = out + m.value_term(w, pos, pos, layer=1)
    _, expected = naive_shaw(q, k, v, m.table_k[1].detach(), m.table_v[1].detach(), pos, pos, 2, causal=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(materialize_bias(m.attention_bias_fn(q, k, pos, pos, 1), 1, 3, 5, 5), bias)
    assert m.needs_attention_weights and not ShawRelativePE(6, value=False).needs_attention_weights
    assert ShawRelativePE(6, key=False).attention_bias(q, k, pos, pos, 0) is None


def test_key_term_is_invariant_to_a_global_shift(device):
    m = ShawRelativePE(4, max_distance=3).to(device)
    q = torch.randn(1, 2, 6, 4, device=device)
    pos = torch.arange(6, device=device)
    torch.testing.assert_close(m.attention_bias(q, q, pos, pos, 0), m.attention_bias(q, q, pos + 50, pos + 50, 0))


def test_shaw_lm_backends_agree():
    cfg = LMConfig(d_model=32, n_layer=2, n_head=2, max_len=16)
    ref = TinyLM(LMConfig(**{**cfg.__dict__, "attn_backend": "reference"}), "shaw")
    fast = TinyLM(cfg, "shaw")
    fast.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(fast(idx), ref(idx))
    assert sum(p.numel() for p in fast.position.parameters()) == 2 * 2 * 33 * 16


def test_validation():
    with pytest.raises(ValueError, match="max_distance must be an int >= 1"):
        shaw_relative_ids(torch.arange(3), 0)
    with pytest.raises(TypeError, match="relative_position must be an integer tensor"):
        shaw_relative_ids(torch.arange(3.0), 2)
    with pytest.raises(ValueError, match=r"table_k must have shape \(2k \+ 1, D\) with D=4"):
        shaw_key_bias(torch.zeros(1, 1, 2, 4), torch.zeros(5, 3), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids must have shape \(T, S\) with T=2"):
        shaw_key_bias(torch.zeros(1, 1, 2, 4), torch.zeros(5, 4), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"weights \(B, H, T, S\) and ids \(T, S\) disagree"):
        shaw_value_term(torch.zeros(1, 1, 2, 3), torch.zeros(5, 4), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"table_v must have shape \(2k \+ 1, Dv\)"):
        shaw_value_term(torch.zeros(1, 1, 2, 3), torch.zeros(4, 4), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="needs key=True or value=True"):
        ShawRelativePE(4, key=False, value=False)
    with pytest.raises(ValueError, match="head_dim must be an int >= 1"):
        ShawRelativePE(0)
