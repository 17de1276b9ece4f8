"""Tests of posenc.diagnostics: attention entropy and attention by distance."""

import math

import pytest
import torch

from posenc import LMConfig, TinyLM, attention
from posenc.diagnostics import attention_by_distance, attention_entropy


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
