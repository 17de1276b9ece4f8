"""Tests of posenc.lab.analysis: singular values, ranks, best rank-k approximation, Gram, covariance, condition,
and the interference of an added table with token embeddings (complement projector, token read-out)."""

import math

import numpy as np
import pytest
import torch

from posenc.lab.analysis import (
    best_rank_k,
    complement_projector,
    condition_number,
    cosine_matrix,
    covariance,
    effective_rank,
    gram,
    neighbour_cosine,
    numerical_rank,
    singular_values,
    token_readout_accuracy,
)

FP64 = dict(rtol=1e-10, atol=1e-12)
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SHAPES = [(12, 7), (7, 12), (9, 9), (1, 5), (5, 1)]


def randn(*shape, dtype=torch.float64, device="cpu", seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(device)


def low_rank(n, c, r, dtype=torch.float64, seed=0):
    """A random product U @ V^T of rank r, formed in ``dtype`` (so a float32 table is rounded to float32)."""
    return randn(n, r, dtype=dtype, seed=seed) @ randn(c, r, dtype=dtype, seed=seed + 1).T  # (n, c)


def with_singular_values(n, c, sigma, seed=0):
    """Q1 diag(sigma) Q2^T from random orthonormal factors: a table with the singular values ``sigma``."""
    sigma = torch.tensor(sigma, dtype=torch.float64)
    q1, _ = torch.linalg.qr(randn(n, len(sigma), seed=seed))  # (n, r)
    q2, _ = torch.linalg.qr(randn(c, len(sigma), seed=seed + 1))  # (c, r)
    return (q1 * sigma) @ q2.T  # (n, c)


def graded(seed=0):
    """A (12, 7) table with singular values 1, 1e-3, 1e-9 (and four zeros, up to rounding)."""
    return with_singular_values(12, 7, [1.0, 1e-3, 1e-9], seed)


def scaled_signed_permutation():
    """3 times a signed permutation: every singular value is exactly 3, also in floating point."""
    p = 3.0 * torch.eye(4, dtype=torch.float64)[torch.tensor([2, 0, 3, 1])]
    p[1] *= -1
    return p  # (4, 4)


# --- cosine matrix and smoothness ------------------------------------------------------------------


def test_cosine_matrix_is_the_cosine_of_the_centred_rows():
    p = randn(9, 5)
    centred = p - p.mean(0)
    naive = torch.tensor([[torch.nn.functional.cosine_similarity(centred[i], centred[j], dim=0).item()
                           for j in range(9)] for i in range(9)], dtype=torch.float64)
    s = cosine_matrix(p)
    assert s.dtype == torch.float64 and torch.allclose(s, naive, **FP64)
    assert torch.allclose(s.diagonal(), torch.ones(9, dtype=torch.float64), **FP64)
    assert torch.allclose(cosine_matrix(3.0 * p + 7.0), s, **FP64)   # blind to scale and to a shared offset


def test_neighbour_cosine_tells_smooth_tables_from_random_ones():
    t = torch.arange(200, dtype=torch.float64)[:, None]
    smooth = torch.cat([torch.sin(t / 20), torch.cos(t / 20), torch.sin(t / 45)], 1)  # (200, 3): slowly turning codes
    assert neighbour_cosine(smooth) > 0.99
    assert abs(neighbour_cosine(randn(2000, 64))) < 0.01               # independent rows: about 0
    alternating = torch.tensor([[1.0, 0.0], [-1.0, 0.0]]).repeat(5, 1)  # each code the opposite of the next
    assert neighbour_cosine(alternating) == pytest.approx(-1.0)


@pytest.mark.parametrize("fn", [cosine_matrix, neighbour_cosine])
def test_cosine_functions_need_two_rows(fn):
    with pytest.raises(ValueError, match="at least 2 rows"):
        fn(torch.ones(1, 4))


# --- singular values and norms -------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_singular_values_match_numpy(device, shape, dtype):
    p = randn(*shape, dtype=dtype, device=device)
    s = singular_values(p)
    assert s.shape == (min(shape),)
    assert bool((s[:-1] >= s[1:]).all()), "singular values must be in descending order"
    expected = np.linalg.svd(p.cpu().double().numpy(), compute_uv=False)
    torch.testing.assert_close(s.cpu(), torch.from_numpy(expected), **FP64)


def test_singular_values_frozen_values():
    torch.testing.assert_close(
        singular_values(torch.tensor([[3.0, 0.0], [0.0, -4.0], [0.0, 0.0]])),
        torch.tensor([4.0, 3.0], dtype=torch.float64),
        **FP64,
    )
    assert singular_values(scaled_signed_permutation()).tolist() == [3.0] * 4


@pytest.mark.parametrize("shape", SHAPES)
def test_frobenius_and_spectral_norms_from_singular_values(device, shape):
    """||P||_F^2 = sum sigma_i^2 (source 000 eq. 6.3.10) and ||P||_2 = sigma_1 (eq. 6.3.11)."""
    p = randn(*shape, device=device)
    s = singular_values(p)
    torch.testing.assert_close(torch.linalg.norm(p, "fro") ** 2, (s**2).sum(), **FP64)
    torch.testing.assert_close(torch.linalg.norm(p, 2), s[0], **FP64)


# --- numerical_rank ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rank", [1, 3, 8])
@pytest.mark.parametrize("n,c", [(40, 24), (24, 40)])
def test_numerical_rank_matches_numpy_matrix_rank_on_low_rank_products(dtype, rank, n, c):
    p = low_rank(n, c, rank, dtype=dtype, seed=rank)
    assert np.linalg.matrix_rank(p.numpy()) == rank
    assert numerical_rank(p) == rank
    # without the tolerance every rounding-sized singular value would count
    assert numerical_rank(p, rtol=0.0) > rank


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_numerical_rank_of_a_full_rank_table(device, dtype, shape):
    p = randn(*shape, dtype=dtype, device=device)
    assert numerical_rank(p) == min(shape) == np.linalg.matrix_rank(p.cpu().numpy())


def test_numerical_rank_depends_on_the_tolerance():
    p = graded()  # singular values 1, 1e-3, 1e-9
    assert numerical_rank(p, rtol=1e-12) == 3
    assert numerical_rank(p, rtol=1e-6) == 2
    assert numerical_rank(p, rtol=1e-2) == 1
    assert numerical_rank(p, rtol=2.0) == 0
    # default: max(N, C) * eps of the input dtype. float64 resolves 1e-9 (tolerance 12 * 2.2e-16) ...
    assert numerical_rank(p) == 3 == np.linalg.matrix_rank(p.numpy())
    # ... float32 does not: rounding the table to float32 moves sigma_3 by ~1e-8, below 12 * 1.2e-7
    assert numerical_rank(p.float()) == 2 == np.linalg.matrix_rank(p.float().numpy())


def test_numerical_rank_tolerance_is_relative_to_sigma_1():
    p = graded()
    for scale in (1e-30, 1.0, 1e30):
        assert [numerical_rank(scale * p, rtol=r) for r in (1e-12, 1e-6, 1e-2)] == [3, 2, 1]


# --- effective_rank ------------------------------------------------------------------------------


def test_effective_rank_of_a_graded_table():
    p = graded()  # squared singular values 1, 1e-6, 1e-18: sigma_1^2 holds 1 / (1 + 1e-6) of the energy
    assert effective_rank(p, 0.5) == 1
    assert effective_rank(p) == 1  # default energy 0.99
    assert effective_rank(p, 0.9999990) == 1
    assert effective_rank(p, 0.9999999) == 2
    # sigma_3^2 = 1e-18 is below the float64 rounding of the running sum (~1e-16): energy 1 gives 2,
    # although the numerical rank is 3
    assert effective_rank(p, 1.0) == 2
    assert numerical_rank(p) == 3


@pytest.mark.parametrize("energy", [0.05, 0.3, 0.5, 0.7, 0.95, 0.99, 1.0])
def test_effective_rank_of_equal_singular_values_is_ceil_energy_times_rank(energy):
    r = 5
    p = with_singular_values(12, 8, [2.0] * r)  # rank 5 in a (12, 8) table, equal singular values
    # energy * r is at least 0.25 away from an integer for every energy (or exactly r for 1.0)
    assert effective_rank(p, energy) == math.ceil(energy * r)


@pytest.mark.parametrize("energy,k", [(0.25, 1), (0.5, 2), (0.75, 3), (1.0, 4), (0.2500001, 2), (0.7499999, 3)])
def test_effective_rank_at_exact_energy_boundaries(energy, k):
    # the singular values are exactly 3: the running sums 9, 18, 27, 36 are exact; ">=" includes the boundary
    assert effective_rank(scaled_signed_permutation(), energy) == k


def test_effective_rank_equals_the_rank_of_the_best_approximation_within_the_energy_budget():
    p = randn(20, 10, seed=3)
    s2 = singular_values(p) ** 2
    for energy in (0.2, 0.5, 0.8, 0.9, 0.99):
        k = effective_rank(p, energy)
        _, err = best_rank_k(p, k)
        assert err**2 <= (1 - energy) * float(s2.sum()) * (1 + 1e-12)
        _, err_smaller = best_rank_k(p, k - 1)
        assert err_smaller**2 > (1 - energy) * float(s2.sum())


# --- best_rank_k ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (9, 9)])
def test_best_rank_k_error_matches_eq_6_3_14(device, shape):
    """||P - P_k||_F = sqrt(sum_{i>k} sigma_i^2) (source 000 eq. 6.3.14), the error taken from the difference."""
    p = randn(*shape, device=device)
    s = singular_values(p).cpu()
    scale = float(s[0])
    for k in range(min(shape) + 1):
        approx, err = best_rank_k(p, k)
        assert isinstance(err, float)
        assert approx.shape == shape
        assert math.isclose(err, math.sqrt(float((s[k:] ** 2).sum())), rel_tol=1e-10, abs_tol=1e-13 * scale)


@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (9, 9)])
def test_best_rank_k_has_rank_k_and_the_ends_are_zero_and_p(device, shape):
    p = randn(*shape, device=device, seed=1)
    for k in range(1, min(shape)):
        assert numerical_rank(best_rank_k(p, k)[0]) == k
    approx, err = best_rank_k(p, 0)
    assert torch.equal(approx, torch.zeros(shape, dtype=torch.float64, device=device))
    assert err == float(torch.linalg.norm(p))
    approx, err = best_rank_k(p, min(shape))
    torch.testing.assert_close(approx, p, **FP64)
    assert err < 1e-12


@pytest.mark.parametrize("k", [1, 2, 4])
def test_best_rank_k_beats_other_rank_k_matrices(k):
    """Eckart-Young sanity check: no rank-k matrix we can construct is closer to P."""
    p = randn(15, 8, seed=2)
    _, best = best_rank_k(p, k)
    g = torch.Generator().manual_seed(10)
    for _ in range(50):
        # a random rank-k matrix
        other = torch.randn(15, k, generator=g, dtype=torch.float64) @ torch.randn(
            k, 8, generator=g, dtype=torch.float64
        )
        assert float(torch.linalg.norm(p - other)) > best
        # P projected onto a random k-dimensional subspace of its columns (the best fit in that subspace)
        q, _ = torch.linalg.qr(torch.randn(8, k, generator=g, dtype=torch.float64))
        assert float(torch.linalg.norm(p - p @ q @ q.T)) > best
        # the rank-k truncation of a slightly perturbed table
        perturbed, _ = best_rank_k(p + 1e-3 * torch.randn(15, 8, generator=g, dtype=torch.float64), k)
        assert numerical_rank(perturbed) == k
        assert float(torch.linalg.norm(p - perturbed)) > best


def test_best_rank_k_of_a_low_rank_table_is_exact():
    p = low_rank(20, 10, 3)
    approx, err = best_rank_k(p, 3)
    torch.testing.assert_close(approx, p, **FP64)
    assert err < 1e-12 * float(torch.linalg.norm(p))


# --- gram ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (1, 3)])
def test_gram_is_symmetric_psd_with_squared_row_norms_on_the_diagonal(device, shape):
    p = randn(*shape, device=device)
    g = gram(p)
    n = shape[0]
    assert g.shape == (n, n)
    torch.testing.assert_close(g, g.T, **FP64)
    torch.testing.assert_close(torch.diagonal(g), (p**2).sum(dim=1), **FP64)
    eig = torch.linalg.eigvalsh(g)  # ascending
    assert float(eig.min()) >= -1e-12 * float(eig.max())
    # its non-zero eigenvalues are the squared singular values of P
    torch.testing.assert_close(eig.flip(0)[: min(shape)], singular_values(p) ** 2, **FP64)


def test_gram_matches_a_naive_loop():
    p = randn(5, 3)
    expected = [[sum(float(p[i, c]) * float(p[j, c]) for c in range(3)) for j in range(5)] for i in range(5)]
    torch.testing.assert_close(gram(p), torch.tensor(expected, dtype=torch.float64), **FP64)
    assert gram(torch.tensor([[1.0, 2.0], [3.0, -1.0]])).tolist() == [[5.0, 1.0], [1.0, 10.0]]


def test_gram_is_positive_definite_only_for_independent_rows():
    assert float(torch.linalg.eigvalsh(gram(randn(4, 6))).min()) > 1e-3  # N <= C, independent rows
    assert float(torch.linalg.eigvalsh(gram(randn(6, 4))).min()) < 1e-12  # N > C: rows must be dependent


# --- covariance ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (2, 3)])
def test_covariance_matches_numpy_population_covariance(device, shape):
    p = randn(*shape, device=device)
    cov = covariance(p)
    assert cov.shape == (shape[1], shape[1])
    expected = torch.from_numpy(np.cov(p.cpu().numpy(), rowvar=False, bias=True))
    torch.testing.assert_close(cov.cpu(), expected, **FP64)
    torch.testing.assert_close(cov, torch.cov(p.T, correction=0), **FP64)
    # torch.cov's default divides by N - 1
    torch.testing.assert_close(cov * shape[0] / (shape[0] - 1), torch.cov(p.T), **FP64)


def test_covariance_frozen_values_and_properties():
    # mean row (1, 2); centred rows (-1, -2), (1, 2); (1/N) P~^T P~ with N = 2
    p = torch.tensor([[0.0, 0.0], [2.0, 4.0]])
    assert covariance(p).tolist() == [[1.0, 2.0], [2.0, 4.0]]
    assert covariance(torch.tensor([[1.0, -2.0, 3.0]])).tolist() == [[0.0] * 3] * 3  # one position
    q = randn(10, 4)
    torch.testing.assert_close(covariance(q + randn(1, 4, seed=5)), covariance(q), **FP64)  # shift-invariant
    assert float(torch.linalg.eigvalsh(covariance(q)).min()) >= -1e-12


# --- condition_number ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (9, 9)])
def test_condition_number_is_sigma_1_over_sigma_min(device, shape):
    p = randn(*shape, device=device)
    s = singular_values(p)
    kappa = condition_number(p)
    assert isinstance(kappa, float) and kappa >= 1.0
    assert math.isclose(kappa, float(s[0] / s[-1]), rel_tol=1e-12)
    assert math.isclose(kappa, float(np.linalg.cond(p.cpu().numpy(), 2)), rel_tol=1e-9)


def test_condition_number_frozen_values():
    assert condition_number(torch.diag(torch.tensor([4.0, 2.0, 0.5]))) == 8.0
    assert condition_number(scaled_signed_permutation()) == 1.0
    q, _ = torch.linalg.qr(randn(6, 6))
    assert math.isclose(condition_number(q), 1.0, rel_tol=1e-12)  # orthogonal: all singular values 1


def test_condition_number_is_inf_for_a_rank_deficient_square_table():
    p = torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 0.0], [5.0, 6.0, 0.0]])  # zero column: sigma_3 is exactly 0
    assert condition_number(p) == math.inf
    assert condition_number(torch.zeros(3, 3)) == math.inf
    assert condition_number(torch.diag(torch.tensor([1.0, 0.0]))) == math.inf


def test_zero_table():
    z = torch.zeros(4, 3)
    assert singular_values(z).tolist() == [0.0, 0.0, 0.0]
    assert numerical_rank(z) == 0 and effective_rank(z) == 0
    assert best_rank_k(z, 2)[1] == 0.0


# --- interference with token embeddings: complement projector and token read-out -----------------


@pytest.mark.parametrize("rank", [0, 1, 3, 8])
def test_complement_projector_removes_every_code_and_keeps_the_rest(device, rank):
    c = 8
    p = low_rank(12, c, rank).to(device) if rank else torch.zeros(12, c, dtype=torch.float64, device=device)
    proj = complement_projector(p)
    assert proj.dtype == torch.float64 and proj.device == p.device and proj.shape == (c, c)
    torch.testing.assert_close(proj, proj.T, **FP64)  # symmetric
    torch.testing.assert_close(proj @ proj, proj, **FP64)  # idempotent
    assert math.isclose(float(proj.trace()), c - rank, abs_tol=1e-9)  # C - r directions are kept
    torch.testing.assert_close(p @ proj, torch.zeros_like(p), rtol=0, atol=1e-12 * float(p.abs().max() + 1))
    x = randn(5, c, device=device, seed=7)  # (x + rho p_n) Pi = x Pi for every pair and scale
    for rho in (0.0, 3.0, 1e3):
        torch.testing.assert_close((x[:, None] + rho * p[None]) @ proj, (x @ proj)[:, None].expand(5, 12, c),
                                   rtol=0, atol=1e-9 * (1 + rho))


def test_complement_projector_of_a_full_rank_table_is_zero_and_of_the_zero_table_is_the_identity():
    assert complement_projector(randn(12, 8)).abs().max() < 1e-12  # N >= C random rows span R^C
    assert torch.equal(complement_projector(torch.zeros(3, 4)), torch.eye(4, dtype=torch.float64))


def test_complement_projector_uses_the_tolerance_of_numerical_rank():
    p = graded()  # singular values 1, 1e-3, 1e-9
    assert math.isclose(float(complement_projector(p).trace()), 7 - numerical_rank(p), abs_tol=1e-9)
    # with rtol=1e-6 the 1e-9 direction does not count towards the rank, so the projector keeps it
    assert math.isclose(float(complement_projector(p, rtol=1e-6).trace()), 5, abs_tol=1e-9)


def test_token_readout_frozen_values():
    tokens = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    table = torch.tensor([[0.0, 0.0], [2.0, 0.0]])  # position 1 pushes every token towards token 0
    # sums (1, 0), (3, 0), (-1, 0), (1, 0): the last is token 1 read as token 0
    assert token_readout_accuracy(tokens, table, 1.0) == 0.75
    assert token_readout_accuracy(tokens, table, 0.0) == 1.0
    assert token_readout_accuracy(tokens, torch.tensor([[0.0, 5.0], [0.0, -5.0]]), 100.0) == 1.0  # orthogonal codes


def test_token_readout_matches_a_naive_loop_and_a_direct_least_squares_fit():
    v, n, c, rho = 7, 5, 4, 1.3
    x, p = randn(v, c, seed=1), randn(n, c, seed=2)
    pairs = [(i, j) for i in range(v) for j in range(n)]
    h = torch.stack([x[i] + rho * p[j] for i, j in pairs])  # (V N, C)
    nearest = [min(range(v), key=lambda k: float((h_ - x[k]).norm())) == i for h_, (i, _) in zip(h, pairs)]
    assert token_readout_accuracy(x, p, rho) == sum(nearest) / len(pairs)
    design = torch.cat([h, torch.ones(len(h), 1, dtype=h.dtype)], 1)  # (V N, C + 1)
    target = torch.eye(v, dtype=h.dtype)[[i for i, _ in pairs]]  # (V N, V) one-hot
    fitted = (design @ torch.linalg.lstsq(design, target).solution).argmax(1)  # QR least squares, not normal equations
    expected = float((fitted == torch.tensor([i for i, _ in pairs])).double().mean())
    assert token_readout_accuracy(x, p, rho, readout="fitted") == expected


@pytest.mark.parametrize("readout", ["nearest", "fitted"])
def test_token_readout_of_concatenated_tables_is_perfect_at_every_scale(readout):
    x, p = randn(4, 3, seed=3), randn(6, 3, seed=4)  # V <= C_x + 1: least squares fits the one-hot tokens exactly
    tokens = torch.cat([x, torch.zeros(4, 3, dtype=x.dtype)], 1)  # [x, 0]
    table = torch.cat([torch.zeros(6, 3, dtype=p.dtype), p], 1)  # [0, p]
    for rho in (0.0, 1.0, 50.0):
        assert token_readout_accuracy(tokens, table, rho, readout=readout) == 1.0


def test_the_fitted_readout_ignores_a_low_rank_table_but_not_a_full_rank_one(device):
    v, n, c = 6, 20, 8  # V <= C - r + 1: an affine fit can separate the projected tokens exactly
    x = randn(v, c, device=device, seed=5)
    low, full = low_rank(n, c, 2).to(device), randn(n, c, device=device, seed=6)
    for rho in (1.0, 10.0, 1000.0):
        assert token_readout_accuracy(x, low, rho, readout="fitted") == 1.0
    assert token_readout_accuracy(x, full, 1000.0, readout="fitted") < 0.5
    assert token_readout_accuracy(x, low, 1000.0, readout="nearest") < 0.5  # the nearest read-out cannot adapt


def test_token_readout_accuracy_falls_with_the_scale_of_a_full_rank_table():
    x, p = randn(32, 8, seed=8) / math.sqrt(8), randn(16, 8, seed=9) / math.sqrt(8)
    for readout in ("nearest", "fitted"):
        acc = [token_readout_accuracy(x, p, rho, readout=readout) for rho in (0.0, 1.0, 2.0, 4.0)]
        assert acc[0] >= acc[-1] and acc[-1] < 0.9 and all(0.0 <= a <= 1.0 for a in acc)


# --- dtype and device ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_results_are_float64_on_the_input_device(device, dtype):
    p = randn(6, 4, device=device).to(dtype)
    exact = p.double()  # the input's values, exactly: results depend on them only, not on the dtype
    for fn in (singular_values, gram, covariance, lambda t: best_rank_k(t, 2)[0]):
        out = fn(p)
        assert out.dtype == torch.float64 and out.device == p.device
        torch.testing.assert_close(out, fn(exact), rtol=0, atol=0)
    assert type(numerical_rank(p)) is int and type(effective_rank(p)) is int
    assert type(best_rank_k(p, 2)[1]) is float and type(condition_number(p)) is float
    assert condition_number(p) == condition_number(exact)


def test_default_rtol_uses_the_epsilon_of_the_input_dtype():
    p = graded()
    for dtype, eps in [(torch.float64, 2.0**-52), (torch.float32, 2.0**-23), (torch.bfloat16, 2.0**-7)]:
        q = p.to(dtype)
        assert numerical_rank(q) == numerical_rank(q, rtol=12 * eps)


# --- bad inputs ----------------------------------------------------------------------------------

TABLE_FUNCTIONS = [
    singular_values,
    numerical_rank,
    effective_rank,
    lambda t: best_rank_k(t, 0),
    gram,
    covariance,
    condition_number,
    cosine_matrix,
    neighbour_cosine,
    complement_projector,
    lambda t: token_readout_accuracy(torch.ones(2, 2), t),
]
IDS = ["singular_values", "numerical_rank", "effective_rank", "best_rank_k", "gram", "covariance", "condition_number",
       "cosine_matrix", "neighbour_cosine", "complement_projector", "token_readout_accuracy"]


@pytest.mark.parametrize("fn", TABLE_FUNCTIONS, ids=IDS)
@pytest.mark.parametrize(
    "table",
    [
        torch.ones(3, 2, dtype=torch.long),
        torch.ones(3, 2, dtype=torch.bool),
        torch.ones(3, 2, dtype=torch.cfloat),
        [[1.0]],
    ],
)
def test_rejects_a_non_floating_table(fn, table):
    with pytest.raises(TypeError, match="table must be a floating-point tensor, got"):
        fn(table)


@pytest.mark.parametrize("fn", TABLE_FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("shape", [(), (4,), (2, 3, 4)])
def test_rejects_a_table_that_is_not_2d(fn, shape):
    with pytest.raises(ValueError, match=r"table must be 2-D \(N, C\), got shape"):
        fn(torch.ones(shape))


@pytest.mark.parametrize("fn", TABLE_FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0)])
def test_rejects_an_empty_table(fn, shape):
    with pytest.raises(ValueError, match=r"table must be non-empty .*got shape \(" + str(shape[0])):
        fn(torch.ones(shape))


@pytest.mark.parametrize("fn", TABLE_FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_rejects_a_non_finite_table(fn, bad):
    table = torch.ones(3, 2)
    table[1, 0] = bad
    with pytest.raises(ValueError, match="table must have only finite entries"):
        fn(table)


@pytest.mark.parametrize("rtol", [-1e-9, math.nan, "1e-6", True, torch.tensor(1e-6)])
def test_numerical_rank_rejects_a_bad_rtol(rtol):
    with pytest.raises(ValueError, match=r"rtol must be a real number >= 0 or None, got"):
        numerical_rank(torch.ones(3, 2), rtol=rtol)


@pytest.mark.parametrize("energy", [0.0, -0.5, 1.0000001, math.nan, True, "0.9"])
def test_effective_rank_rejects_a_bad_energy(energy):
    with pytest.raises(ValueError, match=r"energy must be a real number in \(0, 1\], got"):
        effective_rank(torch.ones(3, 2), energy)


@pytest.mark.parametrize("k", [-1, 3, 2.0, True, None])
def test_best_rank_k_rejects_a_bad_k(k):
    with pytest.raises(ValueError, match=r"k must be an int in 0\.\.2, got"):
        best_rank_k(torch.ones(3, 2), k)


@pytest.mark.parametrize("rtol", [-1e-9, math.nan, "1e-6"])
def test_complement_projector_rejects_a_bad_rtol(rtol):
    with pytest.raises(ValueError, match=r"rtol must be a real number >= 0 or None, got"):
        complement_projector(torch.ones(3, 2), rtol=rtol)


@pytest.mark.parametrize(
    "tokens, error, message",
    [
        (torch.ones(3, 2, dtype=torch.long), TypeError, "tokens must be a floating-point tensor, got torch.int64"),
        ([[1.0, 0.0]], TypeError, "tokens must be a floating-point tensor, got list"),
        (torch.ones(2), ValueError, r"tokens must be 2-D \(V, C\), got shape \(2,\)"),
        (torch.ones(0, 2), ValueError, r"tokens must be non-empty \(V >= 1 and C >= 1\), got shape \(0, 2\)"),
        (torch.tensor([[1.0, math.nan]]), ValueError, "tokens must have only finite entries"),
        (torch.ones(3, 5), ValueError, r"tokens and table must have the same width C, got shapes \(3, 5\) and \(4, "),
    ],
)
def test_token_readout_rejects_bad_tokens(tokens, error, message):
    with pytest.raises(error, match=message):
        token_readout_accuracy(tokens, torch.ones(4, 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_token_readout_rejects_tables_on_two_devices():
    with pytest.raises(ValueError, match="tokens and table must be on the same device, got cuda:0 and cpu"):
        token_readout_accuracy(torch.ones(3, 2, device="cuda"), torch.ones(4, 2))


@pytest.mark.parametrize("scale", [-1.0, math.nan, math.inf, True, "2", torch.tensor(1.0), None])
def test_token_readout_rejects_a_bad_scale(scale):
    with pytest.raises(ValueError, match=r"scale must be a finite real number >= 0, got"):
        token_readout_accuracy(torch.ones(3, 2), torch.ones(4, 2), scale)


@pytest.mark.parametrize("readout", ["fit", "Nearest", None])
def test_token_readout_rejects_an_unknown_readout(readout):
    with pytest.raises(ValueError, match=r"readout must be one of \('nearest', 'fitted'\), got"):
        token_readout_accuracy(torch.ones(3, 2), torch.ones(4, 2), readout=readout)
