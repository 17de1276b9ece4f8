"""Tests of posenc.complex_order: complex-order word embeddings, their shift operator and inner products."""

import math

import numpy as np
import pytest
import torch

from posenc.absolute import sinusoidal_table
from posenc.complex_order import (
    ComplexOrderEmbedding,
    complex_inner_product,
    complex_order_embedding,
    initial_frequencies,
    shift_operator,
    to_real,
)

F64 = dict(atol=1e-12, rtol=1e-12)


def _random_params(t, c, *, seed=0, dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(t, c, generator=g, dtype=torch.float64)
    w = torch.rand(t, c, generator=g, dtype=torch.float64) * math.pi
    th = torch.rand(t, c, generator=g, dtype=torch.float64) * 2 * math.pi
    return [x.to(device=device, dtype=dtype) for x in (r, w, th)]


def _embed_one(r, w, th, p):
    """f(w, p) for one word, (C,) parameters and an int position."""
    return complex_order_embedding(r[None], w[None], th[None], torch.tensor([p], device=r.device))[0]


# --- properties ----------------------------------------------------------------------------------


def test_shift_by_k_is_multiplication_by_the_shift_operator(device):
    r, w, th = _random_params(7, 12, device=device)  # 7 tokens with their own (r, ω, θ)
    g = torch.Generator().manual_seed(1)
    p = torch.randint(0, 500, (7,), generator=g).to(device)
    for k in (-3, 0, 1, 17, 400):
        lo = p + max(0, -k)  # keep p and p + k non-negative
        shifted = complex_order_embedding(r, w, th, lo + k)
        torch.testing.assert_close(shifted, shift_operator(w, k) * complex_order_embedding(r, w, th, lo), **F64)


def test_shift_operator_is_unitary_composes_and_does_not_depend_on_position():
    _, w, _ = _random_params(3, 8)
    s = shift_operator(w, 5)
    torch.testing.assert_close(s.abs(), torch.ones_like(w), **F64)
    torch.testing.assert_close(shift_operator(w, 2) * shift_operator(w, -7), shift_operator(w, -5), **F64)
    torch.testing.assert_close(shift_operator(w, 0), torch.ones_like(w, dtype=torch.complex128))
    # the same map moves the word from 0 to 5 and from 100 to 105
    r, _, th = _random_params(3, 8, seed=1)
    for start in (0, 100):
        before = complex_order_embedding(r, w, th, torch.full((3,), start))
        after = complex_order_embedding(r, w, th, torch.full((3,), start + 5))
        torch.testing.assert_close(after, s * before, **F64)


def test_inner_product_depends_only_on_the_offset_when_frequencies_are_shared():
    (ru, rv), (w, _), (tu, tv) = (x.unbind(0) for x in _random_params(2, 16))  # two words, one shared ω
    for offset in (-4, 0, 3, 50):
        values = [
            complex_inner_product(_embed_one(ru, w, tu, p), _embed_one(rv, w, tv, p + offset))
            for p in (4, 10, 77, 300)
        ]
        # Σ r_u r_v e^{i(ω(q-p) + θ_v - θ_u)}
        closed_form = (ru * rv * torch.exp(1j * (w * offset + tv - tu))).sum()
        for v in values:
            torch.testing.assert_close(v, closed_form, atol=1e-10, rtol=0)


def test_inner_product_of_a_word_with_itself_depends_only_on_the_offset():
    r, w, th = (x[0] for x in _random_params(1, 16))
    a = complex_inner_product(_embed_one(r, w, th, 3), _embed_one(r, w, th, 10))
    b = complex_inner_product(_embed_one(r, w, th, 200), _embed_one(r, w, th, 207))
    torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    torch.testing.assert_close(a, (r * r * torch.exp(1j * w * 7)).sum(), atol=1e-10, rtol=0)


def test_inner_product_depends_on_absolute_position_when_frequencies_differ():
    """Counterexample: one dimension, r = 1, θ = 0, ω_u = 0.5, ω_v = 1; the offset is 3 in both pairs."""
    one, zero = torch.ones(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    wu, wv = torch.full((1,), 0.5, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    a = complex_inner_product(_embed_one(one, wu, zero, 0), _embed_one(one, wv, zero, 3))
    b = complex_inner_product(_embed_one(one, wu, zero, 5), _embed_one(one, wv, zero, 8))
    torch.testing.assert_close(a, torch.tensor(complex(math.cos(3), math.sin(3)), dtype=torch.complex128), **F64)
    torch.testing.assert_close(b, torch.tensor(complex(math.cos(5.5), math.sin(5.5)), dtype=torch.complex128), **F64)
    assert abs(a - b) > 1.0
    # in general: the phase of each term is ω_v q - ω_u p + θ_v - θ_u
    (ru, rv), (wu, wv), (tu, tv) = (x.unbind(0) for x in _random_params(2, 8, seed=3))
    for p, q in [(2, 9), (40, 47)]:
        expected = (ru * rv * torch.exp(1j * (wv * q - wu * p + tv - tu))).sum()
        got = complex_inner_product(_embed_one(ru, wu, tu, p), _embed_one(rv, wv, tv, q))
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


def test_modulus_is_the_absolute_amplitude():
    r, w, th = _random_params(9, 10)
    z = complex_order_embedding(r, w, th, torch.arange(0, 9000, 1000))
    torch.testing.assert_close(z.abs(), r.abs(), **F64)


def test_inner_product_is_hermitian_and_to_real_carries_its_real_part():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 6, generator=g, dtype=torch.complex128)
    b = torch.randn(4, 6, generator=g, dtype=torch.complex128)
    torch.testing.assert_close(complex_inner_product(a, b), complex_inner_product(b, a).conj(), **F64)
    torch.testing.assert_close(complex_inner_product(a, a).real, a.abs().pow(2).sum(-1), **F64)
    torch.testing.assert_close(complex_inner_product(a[0], b[0]), torch.vdot(a[0], b[0]), **F64)
    torch.testing.assert_close((to_real(a) * to_real(b)).sum(-1), complex_inner_product(a, b).real, **F64)


# --- parity --------------------------------------------------------------------------------------


def test_matches_real_cos_sin_formula_by_loops():
    r, w, th = _random_params(5, 6, seed=4)
    pos = [0, 1, 7, 64, 1023]
    z = complex_order_embedding(r, w, th, torch.tensor(pos)).numpy()
    rn, wn, tn = r.numpy(), w.numpy(), th.numpy()
    for t in range(5):
        for c in range(6):
            angle = wn[t, c] * pos[t] + tn[t, c]
            assert z[t, c].real == pytest.approx(rn[t, c] * math.cos(angle), abs=1e-12)
            assert z[t, c].imag == pytest.approx(rn[t, c] * math.sin(angle), abs=1e-12)
    np.testing.assert_allclose(z, rn * np.exp(1j * (wn * np.array(pos)[:, None] + tn)), atol=1e-12)


def test_sinusoidal_init_with_unit_amplitude_and_zero_phase_is_the_sinusoidal_table():
    """f = exp(i ω p) with ω_c = base^{-c/C}: [cos | sin] of a width-2C sinusoidal table."""
    c, n = 8, 40
    m = ComplexOrderEmbedding(3, c, init_phase="zeros")
    w = m.frequency.detach().double()
    ones, zeros = torch.ones(n, c, dtype=torch.float64), torch.zeros(n, c, dtype=torch.float64)
    z = complex_order_embedding(ones, w[[1] * n], zeros, torch.arange(n))  # word 1 at positions 0..n-1
    table = sinusoidal_table(n, 2 * c, layout="half", dtype=torch.float64)  # [sin | cos]
    torch.testing.assert_close(to_real(z), torch.cat([table[:, c:], table[:, :c]], dim=1), atol=1e-6, rtol=0)


# --- frozen values -------------------------------------------------------------------------------


def test_frozen_values():
    r = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    w = torch.tensor([[math.pi / 2, 0.25]], dtype=torch.float64)
    th = torch.tensor([[0.0, math.pi]], dtype=torch.float64)
    z = complex_order_embedding(r, w, th, torch.tensor([1]))
    # 2 e^{iπ/2} = 2i;  -e^{i(0.25 + π)} = e^{0.25 i}
    expected = torch.tensor([[2j, complex(math.cos(0.25), math.sin(0.25))]], dtype=torch.complex128)
    torch.testing.assert_close(z, expected, **F64)
    expected_real = torch.tensor([[0.0, math.cos(0.25), 2.0, math.sin(0.25)]], dtype=torch.float64)
    torch.testing.assert_close(to_real(z), expected_real, **F64)


def test_initial_frequencies_frozen_values():
    expected = torch.tensor([1.0, 10.0**-1, 10.0**-2, 10.0**-3], dtype=torch.float64)
    torch.testing.assert_close(initial_frequencies(4), expected, **F64)
    torch.testing.assert_close(
        initial_frequencies(4, "transformer"), torch.tensor([1.0, 1.0, 1e-2, 1e-2], dtype=torch.float64), **F64
    )  # the authors' code: 10000^{-2⌊c/2⌋/C}


# --- dtypes and devices --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_parameters_get_float32_angles(device, dtype):
    r, w, th = (x.to(dtype) for x in _random_params(4, 8, dtype=torch.float32, device=device))
    pos = torch.tensor([250, 500, 750, 1000], device=device)
    z = complex_order_embedding(r, w, th, pos)
    assert z.dtype == torch.complex64 and z.device.type == device.type
    ref = complex_order_embedding(r.double(), w.double(), th.double(), pos)  # same rounded parameters, float64 angles
    torch.testing.assert_close(z.to(torch.complex128), ref, atol=2e-3, rtol=0)
    # angles computed in the parameters' own 16-bit dtype would be off by more than half a radian
    angle16 = (w * pos[:, None].to(dtype) + th).double()
    assert (angle16 - (w.double() * pos[:, None] + th.double())).abs().max() > 0.5


def test_float64_parameters_give_complex128_and_float32_complex64(device):
    r, w, th = _random_params(2, 4, device=device)
    assert complex_order_embedding(r, w, th, torch.arange(2, device=device)).dtype == torch.complex128
    z = complex_order_embedding(r.float(), w.float(), th.float(), torch.arange(2, device=device))
    assert z.dtype == torch.complex64 and to_real(z).dtype == torch.float32
    assert shift_operator(w.float(), 3).dtype == torch.complex64


# --- module --------------------------------------------------------------------------------------


def test_module_forward_equals_the_pure_function_on_gathered_rows(device):
    m = ComplexOrderEmbedding(11, 6, init_frequency="uniform", generator=torch.Generator().manual_seed(0)).to(device)
    tokens = torch.tensor([[3, 0, 10, 3], [7, 7, 1, 2]], device=device)
    pos = torch.tensor([0, 1, 2, 50], device=device)
    z = m(tokens, pos)
    assert z.shape == (2, 4, 6) and z.dtype == torch.complex64 and z.device.type == device.type
    expected = complex_order_embedding(m.amplitude[tokens], m.frequency[tokens], m.phase[tokens], pos)
    torch.testing.assert_close(z, expected)
    torch.testing.assert_close(m(tokens[0], pos), z[0])  # (T,) tokens give (T, C)
    assert to_real(z).shape == (2, 4, 12)


def test_gradients_reach_all_three_tables():
    m = ComplexOrderEmbedding(5, 4, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([[1, 2, 1]])
    to_real(m(tokens, torch.tensor([3, 4, 5]))).sum().backward()  # Σ r (cos + sin) of the angles
    for name in ("amplitude", "frequency", "phase"):
        grad = getattr(m, name).grad
        assert grad[[1, 2]].abs().sum() > 0, name
        assert (grad[[0, 3, 4]] == 0).all(), name  # unused words get no gradient


def test_default_initialisation_shares_frequencies_so_inner_products_are_relative():
    m = ComplexOrderEmbedding(6, 8, generator=torch.Generator().manual_seed(0))
    assert (m.frequency == m.frequency[0]).all()
    assert ((m.phase >= 0) & (m.phase < 2 * math.pi)).all() and m.phase.std() > 0.5
    pos_a, pos_b = torch.tensor([2, 9]), torch.tensor([30, 37])
    za, zb = m(torch.tensor([1, 4]), pos_a), m(torch.tensor([1, 4]), pos_b)
    a, b = complex_inner_product(za[0], za[1]), complex_inner_product(zb[0], zb[1])
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)


def test_uniform_and_zero_initialisations():
    g = torch.Generator().manual_seed(0)
    m = ComplexOrderEmbedding(2000, 16, init_frequency="uniform", init_phase="zeros", amplitude_std=0.3, generator=g)
    w = m.frequency.detach()
    assert (w >= 0).all() and (w < math.pi).all() and w.mean().item() == pytest.approx(math.pi / 2, rel=0.02)
    assert (m.phase == 0).all()
    assert m.amplitude.std().item() == pytest.approx(0.3, rel=0.02)
    t = ComplexOrderEmbedding(3, 6, init_frequency="transformer")
    expected = initial_frequencies(6, "transformer")
    torch.testing.assert_close(t.frequency.detach()[2].double(), expected, atol=1e-7, rtol=0)


def test_module_generator_makes_initialisation_reproducible():
    a = ComplexOrderEmbedding(4, 3, init_frequency="uniform", generator=torch.Generator().manual_seed(7))
    b = ComplexOrderEmbedding(4, 3, init_frequency="uniform", generator=torch.Generator().manual_seed(7))
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


# --- bad inputs (one test per rule) --------------------------------------------------------------

R, W, TH = (x.float() for x in _random_params(3, 4))
POS = torch.arange(3)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_rejects_non_floating_parameters(which):
    args = [R, W, TH]
    args[which] = args[which].long()
    name = ("amplitude", "frequency", "phase")[which]
    with pytest.raises(TypeError, match=f"{name} must be a floating-point tensor, got torch.int64"):
        complex_order_embedding(*args, POS)


def test_rejects_parameters_of_different_shapes():
    with pytest.raises(ValueError, match=r"must have the same shape, got \(3, 4\), \(3, 5\) and \(3, 4\)"):
        complex_order_embedding(R, torch.zeros(3, 5), TH, POS)


def test_rejects_one_dimensional_parameters():
    with pytest.raises(ValueError, match=r"must be \(\.\.\., T, C\), got shape \(4,\)"):
        complex_order_embedding(R[0], W[0], TH[0], POS)


def test_rejects_float_positions():
    with pytest.raises(TypeError, match="positions must be an integer tensor, got torch.float32"):
        complex_order_embedding(R, W, TH, POS.float())


def test_rejects_positions_that_are_not_1d():
    with pytest.raises(ValueError, match=r"positions must be 1-D \(N,\), got shape \(1, 3\)"):
        complex_order_embedding(R, W, TH, POS[None])


def test_rejects_negative_positions():
    with pytest.raises(ValueError, match="positions must be non-negative, got minimum -1"):
        complex_order_embedding(R, W, TH, torch.tensor([-1, 0, 1]))


def test_rejects_positions_of_the_wrong_length():
    with pytest.raises(ValueError, match=r"positions has 2 entries but the parameters have T = 3"):
        complex_order_embedding(R, W, TH, torch.arange(2))


def test_shift_operator_rejects_a_non_int_shift():
    with pytest.raises(TypeError, match="k must be an int, got float"):
        shift_operator(W, 1.5)


def test_shift_operator_rejects_integer_frequencies():
    with pytest.raises(TypeError, match="frequency must be a floating-point tensor, got torch.int64"):
        shift_operator(torch.arange(4), 1)


def test_inner_product_rejects_real_tensors():
    with pytest.raises(TypeError, match="b must be a complex tensor, got torch.float32"):
        complex_inner_product(torch.zeros(3, dtype=torch.complex64), torch.zeros(3))


def test_to_real_rejects_real_tensors():
    with pytest.raises(TypeError, match="z must be a complex tensor, got torch.float32"):
        to_real(torch.zeros(3))


@pytest.mark.parametrize(
    "name,kwargs", [("vocab_size", dict(vocab_size=0, dim=4)), ("dim", dict(vocab_size=4, dim=2.0))]
)
def test_module_rejects_non_positive_sizes(name, kwargs):
    with pytest.raises(ValueError, match=f"{name} must be a positive int, got"):
        ComplexOrderEmbedding(**kwargs)


def test_module_rejects_an_unknown_frequency_initialisation():
    message = r"init_frequency must be one of \('sinusoidal', 'transformer', 'uniform'\), got 'rope'"
    with pytest.raises(ValueError, match=message):
        ComplexOrderEmbedding(4, 4, init_frequency="rope")


def test_module_rejects_an_unknown_phase_initialisation():
    with pytest.raises(ValueError, match=r"init_phase must be one of \('uniform', 'zeros'\), got 'normal'"):
        ComplexOrderEmbedding(4, 4, init_phase="normal")


def test_module_rejects_a_non_positive_amplitude_std():
    with pytest.raises(ValueError, match="amplitude_std must be a positive number, got 0"):
        ComplexOrderEmbedding(4, 4, amplitude_std=0)


def test_module_rejects_float_tokens():
    with pytest.raises(TypeError, match="tokens must be an integer tensor, got torch.float32"):
        ComplexOrderEmbedding(4, 4)(torch.zeros(1, 3), POS)


def test_module_rejects_tokens_of_the_wrong_rank():
    with pytest.raises(ValueError, match=r"tokens must be \(B, T\) or \(T,\), got shape \(1, 1, 3\)"):
        ComplexOrderEmbedding(4, 4)(torch.zeros(1, 1, 3, dtype=torch.long), POS)


def test_module_rejects_out_of_vocabulary_tokens():
    with pytest.raises(ValueError, match=r"tokens must be in 0..3 \(vocab_size=4\), got values in 0..4"):
        ComplexOrderEmbedding(4, 4)(torch.tensor([[0, 4, 1]]), POS)


def test_module_rejects_tokens_and_positions_of_different_lengths():
    with pytest.raises(ValueError, match="positions has 2 entries but the parameters have T = 3"):
        ComplexOrderEmbedding(4, 4)(torch.tensor([[0, 1, 2]]), torch.arange(2))


def test_initial_frequencies_rejects_an_unknown_init():
    with pytest.raises(ValueError, match="init must be 'sinusoidal' or 'transformer' here, got 'uniform'"):
        initial_frequencies(4, "uniform")


def test_initial_frequencies_rejects_a_base_of_one():
    with pytest.raises(ValueError, match="base must be a number > 1, got 1"):
        initial_frequencies(4, base=1)
