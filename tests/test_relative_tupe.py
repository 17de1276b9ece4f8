"""Tests of posenc.relative.tupe: Ke et al. (2021) untied positional attention."""

import math

import pytest
import torch

from posenc.relative import TUPE, t5_relative_bucket, tupe_position_logits


def naive_eq10(x_q, x_k, p, u_q, u_k, q_pos, k_pos, H):
    """(x_i W^Q)(x_j W^K)^T / sqrt(2D) + (p_i U^Q_h)(p_j U^K_h)^T / sqrt(2D), per head and pair."""
    B, _, T, D = x_q.shape
    S = x_k.shape[2]
    out = torch.zeros(B, H, T, S, dtype=x_q.dtype)
    for b in range(B):
        for h in range(H):
            uq, uk = u_q[:, h * D:(h + 1) * D], u_k[:, h * D:(h + 1) * D]
            for i in range(T):
                for j in range(S):
                    out[b, h, i, j] = (x_q[b, h, i] @ x_k[b, h, j] + (p[q_pos[i]] @ uq) @ (p[k_pos[j]] @ uk)) / math.sqrt(2 * D)
    return out


@pytest.mark.parametrize("relative", [False, True])
def test_full_logit_matches_eq_10_and_11(relative):
    m = TUPE(16, 8, 2, relative=relative, num_buckets=8, max_distance=8, std=1.0).double()
    q_pos, k_pos = torch.arange(3, 7), torch.arange(7)
    qc, kc = torch.randn(1, 2, 4, 4, dtype=torch.float64), torch.randn(1, 2, 7, 4, dtype=torch.float64)
    q, k = m.transform_qk(qc, kc, q_pos, k_pos, 0)
    logits = q @ k.transpose(-2, -1) / 2.0 + m.attention_bias(q, k, q_pos, k_pos, 0)
    expected = naive_eq10(qc, kc, m.p.detach(), m.u_q.detach(), m.u_k.detach(), q_pos, k_pos, 2)
    if relative:  # eq. 11: + b_{j - i}, T5's bucket of key - query
        buckets = t5_relative_bucket(k_pos[None, :] - q_pos[:, None], False, 8, 8)
        expected = expected + m.b.detach()[buckets].permute(2, 0, 1)
    torch.testing.assert_close(logits, expected)


def test_position_term_is_the_same_in_every_layer_and_absolute():
    m = TUPE(16, 8, 2, std=1.0)
    q = torch.zeros(1, 2, 4, 4)
    pos = torch.arange(4)
    assert torch.equal(m.attention_bias(q, q, pos, pos, 0), m.attention_bias(q, q, pos, pos, 3))
    assert not torch.allclose(m.attention_bias(q, q, pos, pos, 0), m.attention_bias(q, q, pos + 5, pos + 5, 0))


def test_parameter_count():
    assert sum(p.numel() for p in TUPE(128, 64, 4).parameters()) == 128 * 64 + 2 * 64 * 64
    assert sum(p.numel() for p in TUPE(128, 64, 4, relative=True).parameters()) == 128 * 64 + 2 * 64 * 64 + 32 * 4


def test_validation():
    m = TUPE(8, 8, 2)
    q = torch.zeros(1, 2, 2, 4)
    with pytest.raises(ValueError, match="only covers positions 0..7"):
        m.attention_bias(q, q, torch.tensor([7, 8]), torch.tensor([7, 8]), 0)
    with pytest.raises(ValueError, match="num_heads=3 must divide d_model=8"):
        TUPE(8, 8, 3)
    with pytest.raises(ValueError, match="num_positions must be an int >= 1"):
        TUPE(0, 8, 2)
    with pytest.raises(ValueError, match="max_distance must be an int greater than the exact range"):
        TUPE(8, 8, 2, relative=True, num_buckets=32, max_distance=16)
    with pytest.raises(ValueError, match=r"need p_q \(T, C\), p_k \(S, C\), u_q and u_k \(C, C\)"):
        tupe_position_logits(torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(8, 4), torch.zeros(8, 8), 2)
