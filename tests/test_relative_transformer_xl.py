"""Tests of posenc.relative.transformer_xl: Dai et al. (2019) relative attention."""

import math

import pytest
import torch

from posenc.relative import TransformerXLPE, transformer_xl_bias, transformer_xl_sinusoids


def test_sinusoids_are_sin_then_cos_for_any_sign():
    d = torch.tensor([-3, 0, 5])
    R = transformer_xl_sinusoids(d, 8)
    for row, delta in zip(R, d.tolist()):
        for i in range(4):
            w = 10000.0 ** (-2 * i / 8)
            assert math.isclose(row[i].item(), math.sin(delta * w), abs_tol=1e-15)
            assert math.isclose(row[4 + i].item(), math.cos(delta * w), abs_tol=1e-15)
    assert R.dtype == torch.float64


def naive_txl(q, k, r_all, u, v, lo, q_pos, k_pos):
    """Terms (b) + (c) + (d) of Dai et al. eq. in section 3.3, for each pair, divided by sqrt(D).

    r_all[h, n] is W_{k,R} R at relative position (key - query) lo + n, i.e. at distance i - j = -(lo + n).
    """
    B, H, T, D = q.shape
    S = k.shape[2]
    out = torch.zeros(B, H, T, S, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(S):
                    r = r_all[h, int(k_pos[j] - q_pos[i]) - lo]
                    out[b, h, i, j] = (q[b, h, i] @ r + u[h] @ k[b, h, j] + v[h] @ r) / math.sqrt(D)
    return out


@pytest.mark.parametrize("q_pos,k_pos", [
    (torch.arange(5), torch.arange(5)),                    # training: the shift path, T = S
    (torch.arange(4, 9), torch.arange(9)),                 # a cache: the shift path, T < S
    (torch.tensor([2, 5, 6]), torch.tensor([0, 1, 5, 9])),  # arbitrary positions: the gather path
])
def test_bias_matches_the_per_pair_loop(q_pos, k_pos):
    m = TransformerXLPE(8, 2, 1, std=0.5).double()
    T, S = len(q_pos), len(k_pos)
    q = torch.randn(2, 2, T, 4, dtype=torch.float64)
    k = torch.randn(2, 2, S, 4, dtype=torch.float64)
    bias = m.attention_bias(q, k, q_pos, k_pos, 0)
    lo = int(k_pos.min() - q_pos.max())
    rel = torch.arange(lo, int(k_pos.max() - q_pos.min()) + 1)
    # W_{k,R} R_{i-j} with R evaluated at the query-minus-key distance, independently of the module
    R = transformer_xl_sinusoids(-rel, 8)
    r_all = (R @ m.w_kr[0].detach()).view(len(rel), 2, 4).transpose(0, 1)
    expected = naive_txl(q, k, r_all, m.u.detach(), m.v.detach(), lo, q_pos, k_pos)
    torch.testing.assert_close(bias, expected)


def test_bias_is_invariant_to_a_global_shift():
    m = TransformerXLPE(8, 2, 1).double()
    q, k = torch.randn(1, 2, 6, 4, dtype=torch.float64), torch.randn(1, 2, 6, 4, dtype=torch.float64)
    pos = torch.arange(6)
    torch.testing.assert_close(m.attention_bias(q, k, pos, pos, 0), m.attention_bias(q, k, pos + 17, pos + 17, 0))


def test_u_and_v_are_shared_by_layers_and_w_kr_is_not():
    m = TransformerXLPE(8, 2, 3)
    assert m.u.shape == (2, 4) and m.v.shape == (2, 4) and m.w_kr.shape == (3, 8, 8)
    assert sum(p.numel() for p in m.parameters()) == 2 * 2 * 4 + 3 * 8 * 8


def test_validation():
    with pytest.raises(TypeError, match="distance must be an integer tensor"):
        transformer_xl_sinusoids(torch.tensor([1.0]), 4)
    with pytest.raises(ValueError, match=r"distance must be 1-D \(N,\)"):
        transformer_xl_sinusoids(torch.zeros(2, 2, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="d_model=6 must be even and divisible by num_heads=4"):
        TransformerXLPE(6, 4)
    with pytest.raises(ValueError, match="d_model=9 must be even"):
        TransformerXLPE(9, 3)
    q = torch.zeros(1, 2, 3, 4)
    pos = torch.arange(3)
    with pytest.raises(ValueError, match=r"expected r \(2, 5, 4\)"):
        transformer_xl_bias(q, q, torch.zeros(2, 4, 4), torch.zeros(2, 4), torch.zeros(2, 4), pos, pos)
