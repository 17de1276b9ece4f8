"""Tests of posenc.relative.common and of every registered relative method inside the tiny LM."""

import pytest
import torch

from posenc.lab import LMConfig, TinyLM
from posenc.attention import materialize_bias
from posenc.relative import RelativeScalarBias, four_terms, relative_positions, relative_shift

RELATIVE_METHODS = ["shaw", "transformer_xl", "t5", "deberta", "tupe"]


def test_relative_positions_is_key_minus_query():
    rel = relative_positions(torch.tensor([2, 3]), torch.tensor([0, 1, 2, 3]))
    assert rel.tolist() == [[-2, -1, 0, 1], [-3, -2, -1, 0]]
    assert rel.dtype == torch.int64


def test_relative_positions_validation():
    with pytest.raises(TypeError, match="q_positions must be an integer tensor"):
        relative_positions(torch.tensor([0.0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="k_positions must be non-negative"):
        relative_positions(torch.tensor([0]), torch.tensor([-1]))


def test_four_terms_sum_to_the_full_logit_and_match_their_definitions():
    g = torch.Generator().manual_seed(0)
    x, p = torch.randn(5, 8, generator=g, dtype=torch.float64), torch.randn(5, 8, generator=g, dtype=torch.float64)
    w_q, w_k = torch.randn(8, 4, generator=g, dtype=torch.float64), torch.randn(8, 4, generator=g, dtype=torch.float64)
    terms = four_terms(x, p, w_q, w_k)
    full = ((x + p) @ w_q) @ ((x + p) @ w_k).T
    torch.testing.assert_close(sum(terms.values()), full)
    for i in range(5):
        for j in range(5):
            assert torch.isclose(terms["content-position"][i, j], (x[i] @ w_q) @ (p[j] @ w_k))
            assert torch.isclose(terms["position-content"][i, j], (p[i] @ w_q) @ (x[j] @ w_k))


def test_four_terms_validation():
    with pytest.raises(ValueError, match=r"x and p must both have shape \(T, C\)"):
        four_terms(torch.zeros(3, 4), torch.zeros(3, 5), torch.zeros(4, 2), torch.zeros(4, 2))
    with pytest.raises(ValueError, match=r"w_q and w_k must both have shape \(C, D\) with C=4"):
        four_terms(torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(5, 2), torch.zeros(5, 2))


@pytest.mark.parametrize("T,S", [(1, 1), (1, 6), (4, 4), (3, 8), (7, 20)])
def test_relative_shift_equals_explicit_indexing(T, S):
    x = torch.randn(2, 3, T, T + S - 1, dtype=torch.float64)
    out = relative_shift(x, S)
    assert out.shape == (2, 3, T, S)
    for t in range(T):
        for s in range(S):
            assert torch.equal(out[..., t, s], x[..., t, s + T - 1 - t])


def test_relative_shift_validation():
    with pytest.raises(ValueError, match="needs s = 6 keys"):
        relative_shift(torch.zeros(3, 8), 5)
    with pytest.raises(ValueError, match="needs s = 2 keys"):
        relative_shift(torch.zeros(3, 4), 3)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, T \+ S - 1\)"):
        relative_shift(torch.zeros(3), 1)


class DistanceBias(RelativeScalarBias):
    """-slope_h * |r| + r / 10: an asymmetric scalar bias of the relative position (a test double)."""

    def __init__(self, slopes):
        super().__init__()
        self.slopes = slopes

    def relative_bias(self, relative, layer):
        return -self.slopes[:, None] * relative.abs() + relative / 10 + layer


@pytest.mark.parametrize("q_pos,k_pos", [(torch.arange(4), torch.arange(4)), (torch.arange(3, 6), torch.arange(6)),
                                         (torch.tensor([1, 4, 9]), torch.tensor([0, 2, 3, 7, 11]))])
def test_relative_scalar_bias_dense_and_function_forms_agree(q_pos, k_pos):
    method = DistanceBias(torch.tensor([0.5, 1.0], dtype=torch.float64))
    q = torch.zeros(1, 2, len(q_pos), 4, dtype=torch.float64)
    k = torch.zeros(1, 2, len(k_pos), 4, dtype=torch.float64)
    dense = method.attention_bias(q, k, q_pos, k_pos, layer=1)
    fn = method.attention_bias_fn(q, k, q_pos, k_pos, layer=1)
    assert dense.shape == (1, 2, len(q_pos), len(k_pos))
    torch.testing.assert_close(materialize_bias(fn, 1, 2, len(q_pos), len(k_pos)), dense, rtol=0, atol=0)
    for i, qi in enumerate(q_pos.tolist()):
        for j, kj in enumerate(k_pos.tolist()):
            r = kj - qi
            assert torch.isclose(dense[0, 1, i, j], torch.tensor(-1.0 * abs(r) + r / 10 + 1, dtype=torch.float64))


def small_lm(name, backend="reference", seed=0):
    cfg = LMConfig(d_model=32, n_layer=2, n_head=2, max_len=24, attn_backend=backend, seed=seed)
    return TinyLM(cfg, name)


@pytest.mark.parametrize("name", RELATIVE_METHODS)
def test_every_relative_method_runs_in_the_lm_on_every_backend(name, device):
    torch.manual_seed(0)
    ref = small_lm(name).to(device)
    fast = small_lm(name, "sdpa").to(device)
    fast.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 256, (2, 24), device=device)
    torch.testing.assert_close(fast(idx), ref(idx), atol=1e-5, rtol=1e-5)
    # position matters: the method changes the model compared with no position at all
    nope = small_lm("nope").to(device)
    nope.load_state_dict(ref.state_dict(), strict=False)
    assert (ref(idx) - nope(idx)).abs().max() > 1e-6
    # causal: a change of the last token does not change earlier logits
    idx2 = idx.clone()
    idx2[:, -1] = (idx2[:, -1] + 1) % 256
    torch.testing.assert_close(ref(idx2)[:, :-1], ref(idx)[:, :-1])
    # every position parameter gets a finite gradient
    ref(idx).logsumexp(-1).mean().backward()
    for pname, p in ref.position.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", ["shaw", "transformer_xl", "t5", "deberta"])
def test_relative_methods_are_shift_invariant(name):
    model = small_lm(name).double()
    idx = torch.randint(0, 256, (2, 10))
    torch.testing.assert_close(model(idx, torch.arange(10)), model(idx, torch.arange(10) + 13))


def test_tupe_is_not_shift_invariant():
    model = small_lm("tupe").double()
    with torch.no_grad():
        model.position.p.normal_()  # make the absolute term large enough to see
    idx = torch.randint(0, 256, (2, 10))
    assert (model(idx, torch.arange(10)) - model(idx, torch.arange(10) + 13)).abs().max() > 1e-3


def _has_flex() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_flex(), reason="torch has no flex_attention")
@pytest.mark.parametrize("name", RELATIVE_METHODS)
def test_every_relative_method_runs_on_the_flex_backend(name, device):
    import warnings

    cfg = dict(d_model=64, n_layer=2, n_head=2, max_len=24)  # head dim 32: the CPU flex kernel's minimum
    ref = TinyLM(LMConfig(**cfg, attn_backend="reference"), name).to(device)
    flex = TinyLM(LMConfig(**cfg, attn_backend="flex"), name).to(device)
    flex.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 256, (2, 24), device=device)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # flex must really run, not fall back
        if name == "shaw":  # the value term needs the weights: Shaw runs on the reference backend
            flex.position.needs_attention_weights = False
            ref.position.needs_attention_weights = False
        torch.testing.assert_close(flex(idx), ref(idx), atol=1e-4, rtol=1e-4)
    if device.type == "cuda":  # FlexAttention has a backward pass on GPUs
        flex(idx).logsumexp(-1).mean().backward()
        grads = [p.grad for p in flex.position.parameters() if p.grad is not None]  # Shaw's value table: unused here
        assert grads and all(torch.isfinite(g).all() for g in grads)
