import math

import pytest
import torch

from posenc import METHODS
from posenc.lab import LMConfig, TinyLM
from posenc.alibi import (ALiBi, alibi_bias, alibi_slopes, attention_reach, effective_slopes,
                          positions_from_padding_mask, uniform_attention)
from posenc.attention import attention
from posenc.kv_cache import cache_for


def reference_rule_slopes(n: int) -> list[float]:
    """The slope rule as the paper's repository states it: a recursion in Python doubles."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + reference_rule_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n", range(1, 65))
def test_slopes_follow_the_reference_rule_for_every_head_count(n):
    expected = torch.tensor(reference_rule_slopes(n), dtype=torch.float64)
    got = alibi_slopes(n)
    assert got.dtype == torch.float32 and got.shape == (n,)
    torch.testing.assert_close(got.double(), expected, rtol=1e-7, atol=0)
    assert torch.equal(got, expected.float())  # the same value after rounding to fp32


def test_slopes_frozen_values():
    assert alibi_slopes(1).tolist() == [2.0**-8]
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]  # the paper's 8-head example
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    torch.testing.assert_close(alibi_slopes(16).double(), torch.tensor([2.0 ** (-k / 2) for k in range(1, 17)], dtype=torch.float64))


@pytest.mark.parametrize("n", range(1, 65))
def test_slopes_are_monotonic_exactly_for_powers_of_two(n):
    s = alibi_slopes(n)
    decreasing = bool((s[1:] < s[:-1]).all())
    assert decreasing == (n & (n - 1) == 0)
    assert float(s.min()) == 2.0**-8  # the gentlest slope never changes with the head count
    assert 0 < float(s.max()) < 1 and len(set(s.tolist())) == n  # all distinct


def test_slopes_bad_input():
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"num_heads must be >= 1, got {bad}"):
            alibi_slopes(bad)
    for bad in (2.0, True, "8", None):
        with pytest.raises(TypeError, match="num_heads must be an int"):
            alibi_slopes(bad)


def naive_bias(slopes, q_pos, k_pos, symmetric):
    H, T, S = len(slopes), len(q_pos), len(k_pos)
    out = torch.empty(H, T, S, dtype=torch.float64)
    for h in range(H):
        for t in range(T):
            for s in range(S):
                i, j = int(q_pos[t]), int(k_pos[s])
                out[h, t, s] = -float(slopes[h]) * (abs(i - j) if symmetric else (i - j))
    return out


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("q_pos, k_pos", [(range(0, 6), range(0, 6)), (range(7, 9), range(0, 9)), (range(3, 7), range(2, 11))])
def test_bias_equals_a_naive_loop(symmetric, q_pos, k_pos, device):
    slopes = alibi_slopes(6)
    qp, kp = torch.tensor(list(q_pos), device=device), torch.tensor(list(k_pos), device=device)
    got = alibi_bias(slopes, qp, kp, symmetric=symmetric)
    assert got.dtype == torch.float32 and got.device.type == device.type
    torch.testing.assert_close(got.cpu().double(), naive_bias(slopes, q_pos, k_pos, symmetric), rtol=1e-6, atol=1e-6)


def test_causal_and_symmetric_agree_on_keys_a_query_sees():
    slopes, pos = alibi_slopes(8), torch.arange(20)
    causal, symmetric = alibi_bias(slopes, pos, pos), alibi_bias(slopes, pos, pos, symmetric=True)
    seen = torch.ones(20, 20, dtype=torch.bool).tril()
    assert torch.equal(causal[:, seen], symmetric[:, seen])
    assert (causal[:, ~seen] > 0).all() and (symmetric[:, ~seen] < 0).all()
    assert torch.equal(symmetric, symmetric.transpose(-1, -2))


def test_bias_depends_only_on_key_minus_query():
    slopes = alibi_slopes(4)
    a = alibi_bias(slopes, torch.arange(5, 10), torch.arange(0, 10))
    b = alibi_bias(slopes, torch.arange(1005, 1010), torch.arange(1000, 1010))
    assert torch.equal(a, b)


def test_bias_with_batched_positions_broadcasts():
    slopes = alibi_slopes(3)
    qp = torch.tensor([[0, 1, 2], [5, 6, 7]])  # (B, T)
    kp = torch.arange(8)  # (S,) shared
    got = alibi_bias(slopes, qp, kp)
    assert got.shape == (2, 3, 3, 8)
    for b in range(2):
        assert torch.equal(got[b], alibi_bias(slopes, qp[b], kp))


def test_bias_bad_input():
    s, p = alibi_slopes(4), torch.arange(4)
    with pytest.raises(TypeError, match="slopes must be a floating-point tensor"):
        alibi_bias(torch.arange(4), p, p)
    with pytest.raises(ValueError, match=r"slopes must be 1-D \(H,\)"):
        alibi_bias(s[None], p, p)
    with pytest.raises(TypeError, match="q_positions must be an integer tensor"):
        alibi_bias(s, p.float(), p)
    with pytest.raises(TypeError, match="k_positions must be an integer tensor"):
        alibi_bias(s, p, p.bool())
    with pytest.raises(ValueError, match="need a last"):
        alibi_bias(s, torch.tensor(3), p)
    with pytest.raises(ValueError, match="do not broadcast"):
        alibi_bias(s, torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long))


def test_placement_before_scale_divides_the_slopes_by_sqrt_d():
    torch.manual_seed(0)
    H, T, D = 4, 7, 16
    q, k, v = (torch.randn(1, H, T, D, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(T)
    slopes = alibi_slopes(H).double()
    delta = alibi_bias(slopes, pos, pos).double()[None] / slopes[:, None, None]  # Δ = key - query
    logits = (q @ k.transpose(-1, -2) + slopes[:, None, None] * delta) / math.sqrt(D)  # (q kᵀ + m Δ) / √D
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.softmax(logits, -1) @ v
    bias = alibi_bias(effective_slopes(slopes, "before_scale", D), pos, pos).double()[None]
    torch.testing.assert_close(attention(q, k, v, bias=bias, causal=True), expected)
    assert torch.equal(effective_slopes(slopes), slopes.float())


def test_effective_slopes_bad_input():
    s = alibi_slopes(4)
    with pytest.raises(ValueError, match="placement must be one of"):
        effective_slopes(s, "inside")
    with pytest.raises(ValueError, match="head_dim must be an int >= 1, got None"):
        effective_slopes(s, "before_scale")


def test_positions_from_padding_mask():
    pad = torch.tensor([[False, False, False, False], [True, True, False, False], [False, False, True, True]])
    assert positions_from_padding_mask(pad).tolist() == [[0, 1, 2, 3], [0, 0, 0, 1], [0, 1, 0, 0]]
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        positions_from_padding_mask(pad.long())
    with pytest.raises(ValueError, match=r"shape \(B, S\)"):
        positions_from_padding_mask(pad[0])


def test_key_only_form_gives_the_same_attention():
    """BLOOM's and the paper code's ``m * key_position`` differs from ``m (key - query)`` by a constant per row."""
    torch.manual_seed(1)
    H, T, D = 8, 12, 8
    q, k, v = (torch.randn(2, H, T, D, dtype=torch.float64) for _ in range(3))
    slopes, pos = alibi_slopes(H).double(), torch.arange(T)
    full = alibi_bias(slopes, pos, pos).double()  # (H, T, S)
    key_only = slopes[:, None, None] * pos.double()[None, None, :]  # (H, 1, S)
    a = attention(q, k, v, bias=full[None], causal=True)
    b = attention(q, k, v, bias=key_only[None], causal=True)
    torch.testing.assert_close(a, b)


def test_left_padded_batch_with_mask_derived_positions_matches_each_row_alone():
    torch.manual_seed(2)
    H, S, D, pad_len = 4, 9, 8, 3
    q, k, v = (torch.randn(2, H, S, D, dtype=torch.float64) for _ in range(3))
    pad = torch.zeros(2, S, dtype=torch.bool)
    pad[1, :pad_len] = True  # row 1 is left-padded
    slopes = alibi_slopes(H)
    pos = positions_from_padding_mask(pad)  # (B, S)
    bias = alibi_bias(slopes, pos, pos).double()  # (B, H, S, S)
    out = attention(q, k, v, bias=bias, causal=True, key_padding_mask=pad)
    alone = attention(
        q[1:, :, pad_len:], k[1:, :, pad_len:], v[1:, :, pad_len:],
        bias=alibi_bias(slopes, torch.arange(S - pad_len), torch.arange(S - pad_len)).double()[None], causal=True,
    )
    torch.testing.assert_close(out[1:, :, pad_len:], alone)
    # with the padding keys masked, index positions (0..S-1 for every row) give the same result
    index = alibi_bias(slopes, torch.arange(S), torch.arange(S)).double()[None]
    torch.testing.assert_close(attention(q, k, v, bias=index, causal=True, key_padding_mask=pad)[:, :, pad_len:], out[:, :, pad_len:])


def test_method_bias_equals_the_pure_function_and_has_no_parameters():
    m = ALiBi(6)
    q = torch.zeros(1, 6, 3, 4)
    qp, kp = torch.arange(4, 7), torch.arange(7)
    assert torch.equal(m.attention_bias(q, q, qp, kp, 0), alibi_bias(alibi_slopes(6), qp, kp)[None])
    fn = m.attention_bias_fn(q, q, qp, kp, 0)
    h, t, s = torch.meshgrid(torch.arange(6), torch.arange(3), torch.arange(7), indexing="ij")
    assert torch.equal(fn(torch.zeros_like(h), h, t, s), alibi_bias(alibi_slopes(6), qp, kp))
    assert list(m.parameters()) == [] and m.state_dict() == {}
    sym = ALiBi(6, symmetric=True)
    assert torch.equal(sym.attention_bias(q, q, qp, kp, 0), alibi_bias(alibi_slopes(6), qp, kp, symmetric=True)[None])
    before = ALiBi(6, placement="before_scale", head_dim=16)
    assert torch.equal(before.slopes, alibi_slopes(6) / 4)
    assert "alibi" in METHODS and isinstance(METHODS["alibi"](LMConfig(n_head=4)), ALiBi)


def test_method_bad_input():
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        ALiBi(0)
    with pytest.raises(TypeError, match="symmetric must be a bool"):
        ALiBi(4, symmetric=1)
    with pytest.raises(ValueError, match="placement must be one of"):
        ALiBi(4, placement="pre")
    with pytest.raises(ValueError, match="head_dim must be an int >= 1"):
        ALiBi(4, placement="before_scale")
    with pytest.raises(ValueError, match=r"slopes must be a float tensor of shape \(num_heads,\) = \(4,\)"):
        ALiBi(4, slopes=torch.ones(3))


def test_slopes_stay_fp32_under_model_casts(device):
    model = TinyLM(LMConfig(n_head=8), "alibi").to(device)
    model.to(torch.bfloat16)
    assert model.position.slopes.dtype == torch.float32 and model.position.slopes.device.type == device.type
    assert torch.equal(model.position.slopes.cpu(), alibi_slopes(8))
    assert not any("slopes" in key for key in model.state_dict())


def small_model(device, backend="sdpa", **kw):
    cfg = LMConfig(d_model=128, n_head=4, n_layer=2, max_len=32, attn_backend=backend, **kw)  # D = 32 (flex on CPU)
    return TinyLM(cfg, "alibi").to(device).eval()


def test_lm_gives_the_same_logits_on_every_backend(device):
    idx = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(3)).to(device)
    with torch.no_grad():
        logits = {b: small_model(device, b)(idx) for b in ("reference", "sdpa", "flex")}
    torch.testing.assert_close(logits["sdpa"], logits["reference"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits["flex"], logits["reference"], rtol=1e-4, atol=1e-4)


def test_lm_runs_past_its_training_length_with_no_table(device):
    model = small_model(device)
    with torch.no_grad():
        logits = model(torch.zeros(1, 100, dtype=torch.long, device=device))  # max_len is 32
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_kv_cache_decoding_equals_the_full_computation(backend, device):
    model = small_model(device, backend)
    idx = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(4)).to(device)
    with torch.no_grad():
        full = model(idx)
        cache = cache_for(model, batch=2, max_len=20)
        steps = [model(idx[:, :8], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(8, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)


def test_left_padded_batch_in_the_lm_matches_each_sequence_alone(device):
    model = small_model(device)
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randint(0, 256, (1, 12), generator=gen), torch.randint(0, 256, (1, 7), generator=gen)
    pad_len = 12 - 7
    batch = torch.cat([a, torch.cat([torch.zeros(1, pad_len, dtype=torch.long), b], 1)]).to(device)  # (2, 12)
    pad = torch.zeros(2, 12, dtype=torch.bool, device=device)
    pad[1, :pad_len] = True
    with torch.no_grad():
        together = model(batch, key_padding_mask=pad)
        alone_a, alone_b = model(a.to(device)), model(b.to(device))
        # and decoding on from the padded prompt with a cache equals the unpadded full sequence
        nxt = torch.randint(0, 256, (2, 3), generator=gen).to(device)
        cache = cache_for(model, batch=2, max_len=15)
        model(batch, key_padding_mask=pad, cache=cache)
        steps = [model(nxt[:, t : t + 1], cache=cache, key_padding_mask=torch.cat([pad, torch.zeros(2, t + 1, dtype=torch.bool, device=device)], 1)) for t in range(3)]
        full_b = model(torch.cat([b.to(device), nxt[1:]], 1))
    torch.testing.assert_close(together[0:1], alone_a, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(together[1:, pad_len:], alone_b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.cat(steps, 1)[1:], full_b[:, 7:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("context", [1, 7, 128, 1000])
def test_uniform_attention_is_what_attention_computes_for_equal_content(context):
    H = 8
    slopes = alibi_slopes(H)
    q = torch.zeros(1, H, 1, 4, dtype=torch.float64)  # q·k = 0 for every key: uniform content
    k = torch.randn(1, H, context, 4, dtype=torch.float64)
    pos = torch.arange(context)
    bias = alibi_bias(slopes, pos[-1:], pos).double()[None]  # (1, H, 1, S)
    _, w = attention(q, k, k, bias=bias, causal=True, return_weights=True)  # (1, H, 1, S)
    expected = uniform_attention(slopes, context)  # (H, context), column d = distance d
    torch.testing.assert_close(w[0, :, 0].flip(-1), expected)


@pytest.mark.parametrize("context", [1, 5, 128, 1000, 5000, None])
@pytest.mark.parametrize("mass", [0.5, 0.9, 0.99])
def test_attention_reach_closed_form_equals_the_cumulative_weights(context, mass):
    slopes = torch.cat([alibi_slopes(16), torch.tensor([1e-3, 3.0])])
    got = attention_reach(slopes, context, mass)
    c = 200_000 if context is None else context  # effectively unbounded for these slopes
    cum = uniform_attention(slopes, c).cumsum(-1)  # (H, c)
    expected = (cum < mass).sum(-1)  # first distance whose cumulative weight reaches mass
    assert torch.equal(got, expected)


def test_attention_reach_values_and_bad_input():
    assert attention_reach(torch.tensor([2.0**-8]), None, 0.9).item() == math.ceil(256 * math.log(10)) - 1 == 589
    assert attention_reach(torch.tensor([0.5]), None, 0.9).item() == 4
    with pytest.raises(ValueError, match="mass must be in"):
        attention_reach(alibi_slopes(4), 10, 1.0)
    with pytest.raises(ValueError, match="slopes must all be > 0"):
        attention_reach(torch.tensor([0.5, 0.0]), 10)
    with pytest.raises(ValueError, match="context must be an int >= 1"):
        attention_reach(alibi_slopes(4), 0)


def test_alibi_builds_on_the_meta_device():
    # deferred (FSDP-style) initialisation: the slopes are computed when the module leaves the meta device
    from posenc.alibi import ALiBi

    with torch.device("meta"):
        method = ALiBi(12)
    assert method.slopes.is_meta
    method.to_empty(device="cpu")
    assert torch.equal(method.slopes, ALiBi(12).slopes)


def test_a_bias_for_another_head_count_is_named():
    from posenc.alibi import ALiBi
    from posenc.attention import SelfAttention

    with pytest.raises(ValueError, match="ALiBi gives a bias for 8 heads but this layer has n_head=4"):
        SelfAttention(32, 4)(torch.randn(1, 5, 32), torch.arange(5), ALiBi(8))
