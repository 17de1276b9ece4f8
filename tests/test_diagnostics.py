"""Tests of posenc.lab.diagnostics: attention entropy, attention by distance, captured queries and keys, scores by distance."""

import math

import pytest
import torch

from posenc import attention
from posenc.lab import LMConfig, TinyLM
from posenc.lab.diagnostics import attention_by_distance, attention_entropy, capture_qk, score_by_distance


def causal_weights(B, H, T, S, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, 8, generator=gen, dtype=torch.float64).to(device)
    k = torch.randn(B, H, S, 8, generator=gen, dtype=torch.float64).to(device)
    _, w = attention(q, k, k, causal=True, return_weights=True)
    return w  # (B, H, T, S)


def test_entropy_of_uniform_and_one_hot(device):
    for m in (1, 2, 7, 100):
        w = torch.full((m,), 1.0 / m, device=device)[None]  # (1, m)
        assert math.isclose(float(attention_entropy(w)), math.log(m), rel_tol=1e-6, abs_tol=1e-12)
    one_hot = torch.zeros(3, 5, device=device)
    one_hot[:, 2] = 1
    assert torch.equal(attention_entropy(one_hot), torch.zeros(3, dtype=torch.float64, device=device))


def test_entropy_matches_the_definition_and_ignores_masked_keys(device):
    w = causal_weights(2, 3, 6, 6, device)
    naive = torch.zeros(2, 3, 6, dtype=torch.float64)
    for idx in torch.cartesian_prod(torch.arange(2), torch.arange(3), torch.arange(6)).tolist():
        row = w[tuple(idx)].cpu()
        naive[tuple(idx)] = -sum(float(p) * math.log(float(p)) for p in row if p > 0)
    torch.testing.assert_close(attention_entropy(w).cpu(), naive, rtol=1e-12, atol=1e-12)
    assert attention_entropy(w).dtype == torch.float64 and attention_entropy(w).device.type == device.type
    assert bool((attention_entropy(w)[..., 0] == 0).all())  # the first query sees one key


def test_by_distance_moves_each_weight_to_its_distance(device):
    B, H, T, S = 2, 3, 4, 9  # queries at positions 5..8 (a cache of 5 keys)
    w = causal_weights(B, H, T, S, device)
    out = attention_by_distance(w)
    assert out.shape == (B, H, T, S) and out.dtype == torch.float64
    for t in range(T):
        i = S - T + t
        for d in range(S):
            expected = w[..., t, i - d] if d <= i else torch.zeros(B, H, dtype=w.dtype, device=device)
            torch.testing.assert_close(out[..., t, d], expected.double(), rtol=0, atol=0)
    torch.testing.assert_close(out.sum(-1), w.double().sum(-1), rtol=0, atol=1e-15)


def test_by_distance_of_a_trained_models_weights(device):
    model = TinyLM(LMConfig(vocab_size=16, d_model=16, n_head=2, n_layer=1, max_len=12), "alibi").to(device)
    idx = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(0)).to(device)
    _, weights = model(idx, return_weights=True)
    by_d = attention_by_distance(weights[0])  # (B, H, T, S)
    # ALiBi with equal-content keys is most on distance 0; here just check the bookkeeping
    assert torch.allclose(by_d.sum(-1), torch.ones(2, 2, 12, dtype=torch.float64, device=device), atol=1e-6)
    assert bool((by_d[..., 3, 4:] == 0).all())  # query 3 has no key 4 or more back


@pytest.mark.parametrize("bad, error", [
    (torch.ones(3, 4, dtype=torch.long), TypeError),
    ([[1.0]], TypeError),
    (torch.ones(4), ValueError),
    (torch.ones(5, 3), ValueError),  # T > S
])
def test_bad_weights(bad, error):
    for fn in (attention_entropy, attention_by_distance):
        with pytest.raises(error, match="weights"):
            fn(bad)


def test_by_distance_rejects_non_causal_weights():
    with pytest.raises(ValueError, match="causal"):
        attention_by_distance(torch.full((3, 3), 1 / 3))


def test_score_by_distance_is_the_mean_over_the_pairs_at_each_distance(device):
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 3, 7, 4, generator=gen).to(device) for _ in range(2))
    got = score_by_distance(q, k)
    assert got.shape == (2, 3, 7) and got.dtype == torch.float64 and got.device.type == torch.device(device).type
    for d in range(7):  # the definition, by loops
        pairs = [(q[..., i, :].double() * k[..., i - d, :].double()).sum(-1) / 2 for i in range(d, 7)]
        torch.testing.assert_close(got[..., d], torch.stack(pairs).mean(0))
    assert torch.allclose(score_by_distance(q, k, scale=1.0), 2 * got)


def test_score_by_distance_of_rope_with_a_fixed_query_and_key_is_a_sum_of_cosines():
    # Check of the mathematics: q and k the same at every position, rotated by RoPE: the score at distance d
    # is sum_i |q_i||k_i| cos(d theta_i + phase_i), the same for every pair at that distance
    from posenc.rope import RotaryEmbedding

    T, D = 20, 8
    rope = RotaryEmbedding(D, T)
    q = torch.zeros(1, 1, T, D, dtype=torch.float64)
    q[..., 0] = 1.0  # pair 0 (dims 0 and D/2 in the half layout): (1, 0)
    k = q.clone()
    qr, kr = rope.transform_qk(q, k, torch.arange(T), torch.arange(T), 0)
    expected = torch.cos(torch.arange(T, dtype=torch.float64) * 1.0)  # theta_0 = base ** 0 = 1
    torch.testing.assert_close(score_by_distance(qr, kr, scale=1.0)[0, 0], expected, atol=1e-6, rtol=0)  # fp32 cos/sin cache


def test_capture_qk_records_what_attention_scores_and_restores_the_method():
    torch.manual_seed(0)
    model = TinyLM(LMConfig(vocab_size=32, d_model=16, n_layer=2, n_head=2, max_len=16), "rope").eval()
    x = torch.randint(0, 32, (2, 10))
    with capture_qk(model.position) as qk:
        _, weights = model(x, return_weights=True)
    assert [layer for layer, _, _ in qk] == [0, 1]
    for (layer, q, k), w in zip(qk, weights):  # softmax of the captured scores are the model's weights
        _, expected = attention(q, k, k, causal=True, return_weights=True)
        torch.testing.assert_close(expected, w)
    assert "transform_qk" not in vars(model.position)  # restored
    with capture_qk(model.position) as outer:  # nested: the inner capture hands back the outer one's recorder
        with capture_qk(model.position) as inner:
            model(x)
        model(x)
    assert len(inner) == 2 and len(outer) == 4 and "transform_qk" not in vars(model.position)
    with pytest.raises(RuntimeError, match="boom"):
        with capture_qk(model.position):
            raise RuntimeError("boom")
    assert "transform_qk" not in vars(model.position)
    with pytest.raises(TypeError, match="method must be a PositionMethod, got Linear"):
        with capture_qk(torch.nn.Linear(2, 2)):
            pass


@pytest.mark.parametrize("q, k, error", [
    (torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4), TypeError),
    (torch.zeros(3, 4), torch.zeros(3, 5), ValueError),
    (torch.zeros(4), torch.zeros(4), ValueError),
])
def test_score_by_distance_bad_input(q, k, error):
    with pytest.raises(error):
        score_by_distance(q, k)
