"""Tests of posenc.relative.deberta: He et al. (2021) disentangled attention."""

import math

import numpy as np
import pytest
import torch

from posenc.attention import materialize_bias
from posenc.relative import DebertaPE, deberta_bias, deberta_log_bucket, deberta_relative_ids, relative_positions


def log_bucket_by_rule(r: int, bucket_size: int, max_position: int) -> int:
    """DeBERTa-v2's make_log_bucket_position for one integer, float32 as in the released code."""
    mid = bucket_size // 2
    if abs(r) <= mid:
        return r
    x = np.float32(np.log(np.float32(abs(r)) / np.float32(mid))) / np.float32(math.log((max_position - 1) / mid))
    return int(np.sign(r)) * (int(np.ceil(np.float32(x * np.float32(mid - 1)))) + mid)


@pytest.mark.parametrize("bucket_size,max_position", [(256, 512), (32, 128), (8, 64)])
def test_log_bucket_follows_the_rule_and_is_odd(bucket_size, max_position):
    r = torch.arange(-1000, 1001)
    got = deberta_log_bucket(r, bucket_size, max_position)
    assert got.tolist() == [log_bucket_by_rule(int(x), bucket_size, max_position) for x in r]
    assert torch.equal(deberta_log_bucket(-r, bucket_size, max_position), -got)
    assert got[r == max_position - 1].item() == bucket_size - 1       # the last bucket before clipping


def test_relative_ids_follow_eq_3():
    k = 3
    pos = torch.arange(8)
    c2p, p2c_code = deberta_relative_ids(relative_positions(pos, pos), k)
    _, p2c_paper = deberta_relative_ids(relative_positions(pos, pos), k, p2c="paper")
    delta = lambda i, j: min(max(i - j + k, 0), 2 * k - 1)  # noqa: E731
    for i in range(8):
        for j in range(8):
            assert c2p[i, j] == delta(i, j) == p2c_code[i, j]
            assert p2c_paper[i, j] == delta(j, i)


def test_code_convention_is_what_the_released_gather_computes():
    """relative_pos[x, y] = x - y; p2c_pos = clamp(-relative_pos + k); gather over key rows, then transpose."""
    k, L, D = 3, 7, 4
    g = torch.Generator().manual_seed(0)
    keys, q_rel = torch.randn(L, D, generator=g), torch.randn(2 * k, D, generator=g)
    ids = torch.arange(L)
    p2c_pos = torch.clamp(-(ids[:, None] - ids[None, :]) + k, 0, 2 * k - 1)
    released = torch.gather(keys @ q_rel.T, -1, p2c_pos).T  # (query, key)
    _, p2c_code = deberta_relative_ids(relative_positions(ids, ids), k)
    _, p2c_paper = deberta_relative_ids(relative_positions(ids, ids), k, p2c="paper")
    ours = torch.stack([torch.stack([keys[j] @ q_rel[p2c_code[i, j]] for j in range(L)]) for i in range(L)])
    paper = torch.stack([torch.stack([keys[j] @ q_rel[p2c_paper[i, j]] for j in range(L)]) for i in range(L)])
    torch.testing.assert_close(ours, released)
    assert not torch.allclose(paper, released)


def naive_eq4(qc, kc, q_rel, k_rel, c2p, p2c):
    """(Q^c_i·K^c_j + Q^c_i·K^r_c2p[i,j] + K^c_j·Q^r_p2c[i,j]) / sqrt(3D), pair by pair."""
    B, H, T, D = qc.shape
    S = kc.shape[2]
    out = torch.zeros(B, H, T, S, dtype=qc.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(S):
                    out[b, h, i, j] = (qc[b, h, i] @ kc[b, h, j] + qc[b, h, i] @ k_rel[h, c2p[i, j]]
                                       + kc[b, h, j] @ q_rel[h, p2c[i, j]]) / math.sqrt(3 * D)
    return out


@pytest.mark.parametrize("max_position", [None, 20])
@pytest.mark.parametrize("p2c", ["code", "paper"])
def test_full_logit_matches_eq_4(max_position, p2c):
    m = DebertaPE(8, 2, 2, span=4, max_position=max_position, p2c=p2c, std=0.5).double()
    q_pos, k_pos = torch.arange(6, 12), torch.arange(12)
    qc, kc = torch.randn(2, 2, 6, 4, dtype=torch.float64), torch.randn(2, 2, 12, 4, dtype=torch.float64)
    q, k = m.transform_qk(qc, kc, q_pos, k_pos, 1)
    logits = q @ k.transpose(-2, -1) / math.sqrt(4) + m.attention_bias(q, k, q_pos, k_pos, 1)
    P = m.rel.detach()
    q_rel = (P @ m.w_qr[1].detach()).view(8, 2, 4).transpose(0, 1)
    k_rel = (P @ m.w_kr[1].detach()).view(8, 2, 4).transpose(0, 1)
    c2p, p2c_ids = deberta_relative_ids(relative_positions(q_pos, k_pos), 4, max_position=max_position, p2c=p2c)
    torch.testing.assert_close(logits, naive_eq4(qc, kc, q_rel, k_rel, c2p, p2c_ids))
    fn = m.attention_bias_fn(q, k, q_pos, k_pos, 1)
    torch.testing.assert_close(materialize_bias(fn, 2, 2, 6, 12), m.attention_bias(q, k, q_pos, k_pos, 1))


def test_relative_table_is_shared_by_layers():
    m = DebertaPE(16, 4, 3, span=8)
    assert m.rel.shape == (16, 16) and m.w_qr.shape == m.w_kr.shape == (3, 16, 16)


def test_validation():
    r = torch.arange(3)
    with pytest.raises(TypeError, match="relative_position must be an integer tensor"):
        deberta_log_bucket(r.float(), 8, 64)
    with pytest.raises(ValueError, match="bucket_size must be an int >= 2"):
        deberta_log_bucket(r, 1, 64)
    with pytest.raises(ValueError, match="max_position must be an int >= 6"):
        deberta_log_bucket(r, 8, 5)
    with pytest.raises(ValueError, match="span must be an int >= 1"):
        deberta_relative_ids(r, 0)
    with pytest.raises(ValueError, match="p2c must be one of"):
        deberta_relative_ids(r, 4, p2c="foo")
    with pytest.raises(ValueError, match="num_heads=3 must divide d_model=8"):
        DebertaPE(8, 3)
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"q_rel and k_rel must both be \(H, 2k, D\)"):
        deberta_bias(q, q, torch.zeros(2, 6, 4), torch.zeros(2, 6, 3), *[torch.zeros(3, 3, dtype=torch.long)] * 2)
    with pytest.raises(ValueError, match=r"c2p_ids and p2c_ids must be \(T, S\)"):
        deberta_bias(q, q, torch.zeros(2, 6, 4), torch.zeros(2, 6, 4), *[torch.zeros(3, 2, dtype=torch.long)] * 2)
