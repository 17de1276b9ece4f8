"""Tests of posenc.absolute: the sinusoidal table, its offset matrices, learned tables and regularisers."""

import math

import numpy as np
import pytest
import torch

from posenc.absolute import (
    HybridPE,
    LearnedPE,
    LowRankPE,
    SinusoidalPE,
    difference_penalty,
    extend_table,
    interpolate_table,
    inverse_frequencies,
    l2_penalty,
    layout_permutation,
    offset_matrix,
    sinusoidal_code,
    sinusoidal_table,
    spectral_penalty,
)
from posenc.lab.lm import LMConfig, TinyLM
from posenc.method import build_method

F64 = dict(atol=1e-12, rtol=1e-12)


def test_frozen_values_interleaved():
    table = sinusoidal_table(2, 4, dtype=torch.float64)
    expected = torch.tensor([[0.0, 1.0, 0.0, 1.0], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]], dtype=torch.float64)
    torch.testing.assert_close(table, expected, **F64)


def test_matches_the_paper_formula_by_loops():
    n, d, base = 50, 12, 10000.0
    table = sinusoidal_table(n, d, base, dtype=torch.float64)
    for t in range(n):
        for i in range(d // 2):
            angle = t / base ** (2 * i / d)
            assert table[t, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert table[t, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_half_layout_is_a_column_permutation_of_interleaved():
    inter = sinusoidal_table(30, 10, dtype=torch.float64)
    half = sinusoidal_table(30, 10, layout="half", dtype=torch.float64)
    perm = layout_permutation(10)
    assert perm.tolist() == [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]
    assert torch.equal(half, inter[:, perm])
    assert sorted(perm.tolist()) == list(range(10))


def test_inverse_frequencies_and_wavelength_range():
    for d, base in [(8, 10000.0), (64, 10000.0), (6, 500.0)]:
        w = inverse_frequencies(d, base)
        assert w.dtype == torch.float64 and w.shape == (d // 2,)
        assert w[0] == 1.0 and (w[1:] < w[:-1]).all()
        wavelengths = 2 * math.pi / w
        assert wavelengths[0].item() == pytest.approx(2 * math.pi)
        assert wavelengths[-1].item() == pytest.approx(2 * math.pi * base ** ((d - 2) / d))
        assert wavelengths[-1] < 2 * math.pi * base


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_offset_matrix_moves_every_position_by_k(layout):
    n, d = 300, 16
    table = sinusoidal_table(n, d, layout=layout, dtype=torch.float64)
    for k in (-37, -1, 0, 1, 5, 100):
        m = offset_matrix(k, d, layout=layout)
        torch.testing.assert_close(m @ m.T, torch.eye(d, dtype=torch.float64), **F64)  # a rotation
        lo, hi = max(0, -k), min(n, n - k)
        torch.testing.assert_close(table[lo + k : hi + k], table[lo:hi] @ m.T, atol=1e-10, rtol=0)


def test_offset_matrices_compose_and_generate_the_table():
    d = 8
    m1 = offset_matrix(1, d)
    torch.testing.assert_close(offset_matrix(7, d), torch.linalg.matrix_power(m1, 7), atol=1e-12, rtol=0)
    torch.testing.assert_close(offset_matrix(3, d) @ offset_matrix(-5, d), offset_matrix(-2, d), atol=1e-12, rtol=0)
    p = sinusoidal_table(1, d, dtype=torch.float64)[0]
    rows = [p]
    for _ in range(63):  # the recurrence p_{t+1} = M_1 p_t
        rows.append(m1 @ rows[-1])
    torch.testing.assert_close(torch.stack(rows), sinusoidal_table(64, d, dtype=torch.float64), atol=1e-10, rtol=0)


def test_dot_product_depends_only_on_the_offset():
    d = 32
    table = sinusoidal_table(200, d, dtype=torch.float64)
    w = inverse_frequencies(d)
    for t, s in [(0, 0), (3, 10), (150, 20), (199, 0)]:
        expected = torch.cos((t - s) * w).sum()
        torch.testing.assert_close(table[t] @ table[s], expected, **F64)
    # and it cannot tell the direction: offset +k and -k give the same dot product
    torch.testing.assert_close(table[50] @ table[60], table[60] @ table[50])


def test_large_positions_are_exact_in_float64():
    pos = torch.tensor([10**6, 123_456_789])
    code = sinusoidal_code(pos, 4, dtype=torch.float64)
    assert code[1, 0].item() == pytest.approx(math.sin(123_456_789), abs=1e-7)
    assert code[0, 2].item() == pytest.approx(math.sin(10**6 * 0.01), abs=1e-9)


def test_dtype_and_device(device):
    table = sinusoidal_table(10, 8, dtype=torch.bfloat16, device=device)
    assert table.dtype == torch.bfloat16 and table.device.type == device.type
    code = sinusoidal_code(torch.arange(10, device=device), 8)
    assert code.device.type == device.type and code.dtype == torch.float32
    torch.testing.assert_close(code.cpu(), sinusoidal_table(10, 8))


def test_validation():
    with pytest.raises(ValueError, match="num_positions must be a positive int, got 0"):
        sinusoidal_table(0, 8)
    with pytest.raises(ValueError, match="dim must be a positive even int, got 7"):
        sinusoidal_table(4, 7)
    with pytest.raises(ValueError, match="dim must be a positive even int, got 0"):
        inverse_frequencies(0)
    with pytest.raises(ValueError, match="base must be a number > 1, got 1.0"):
        sinusoidal_table(4, 8, base=1.0)
    with pytest.raises(ValueError, match=r"layout must be one of \('interleaved', 'half'\), got 'neox'"):
        sinusoidal_table(4, 8, layout="neox")
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        sinusoidal_code(torch.arange(4.0), 8)
    with pytest.raises(TypeError, match="k must be an int, got float"):
        offset_matrix(1.5, 8)


# --- modules -----------------------------------------------------------------------------------


def test_sinusoidal_module_adds_scaled_code_at_any_length(device):
    m = SinusoidalPE(8, scale=0.5)
    x = torch.randn(2, 5, 8, dtype=torch.float64, device=device)
    pos = torch.tensor([0, 1, 2, 10_000, 10_001], device=device)
    out = m.transform_input(x, pos)
    assert out.dtype == torch.float64 and out.device.type == device.type
    expected = 0.5 * sinusoidal_code(pos.cpu(), 8, dtype=torch.float64).to(device)
    torch.testing.assert_close(out - x, expected.expand_as(x), **F64)
    assert m.max_positions is None and list(m.parameters()) == []
    torch.testing.assert_close(m.table(3), 0.5 * sinusoidal_table(3, 8))
    assert m.transform_input(x.bfloat16(), pos).dtype == torch.bfloat16


@pytest.mark.parametrize("init,check", [
    ("normal", lambda w: abs(w.std().item() - 0.05) < 0.005),
    ("uniform", lambda w: w.abs().max().item() <= math.sqrt(3) * 0.05 and abs(w.std().item() - 0.05) < 0.005),
    ("zeros", lambda w: (w == 0).all().item()),
])
def test_learned_initialisations(init, check):
    torch.manual_seed(0)
    m = LearnedPE(256, 64, init=init, std=0.05)
    assert m.table().shape == (256, 64) and check(m.table().detach())


def test_learned_uniform_bound_and_norm_formula():
    """E‖p‖² = C a²/3 for U[-a, a] and C σ² for N(0, σ²) (source 000, eqs. 6.3.15-6.3.16, squared norms)."""
    torch.manual_seed(0)
    u = LearnedPE(20000, 16, init="uniform", a=0.3).table().detach().double()
    n = LearnedPE(20000, 16, init="normal", std=0.3).table().detach().double()
    assert u.abs().max() <= 0.3
    assert u.pow(2).sum(1).mean().item() == pytest.approx(16 * 0.3**2 / 3, rel=0.02)
    assert n.pow(2).sum(1).mean().item() == pytest.approx(16 * 0.3**2, rel=0.02)


def test_learned_table_rejects_positions_beyond_its_size():
    m = LearnedPE(8, 4)
    x = torch.zeros(1, 3, 4)
    torch.testing.assert_close(m.transform_input(x, torch.tensor([5, 6, 7])), m.table()[5:8][None].detach() + x)
    with pytest.raises(ValueError, match=r"only covers positions 0..7 \(max_positions=8\); it does not wrap or clamp"):
        m.transform_input(x, torch.tensor([6, 7, 8]))


def test_learned_gradient_reaches_only_used_rows():
    m = LearnedPE(8, 4)
    x = torch.randn(2, 3, 4)
    m.transform_input(x, torch.tensor([1, 2, 3])).sum().backward()
    grad = m.weight.grad
    assert (grad[[0, 4, 5, 6, 7]] == 0).all() and (grad[1:4] == 2.0).all()  # two batch rows


def test_extend_table_keeps_old_rows_and_fills_new_ones(device):
    table = torch.randn(5, 3, device=device)
    copy = extend_table(table, 12)
    assert copy.shape == (12, 3) and copy.device == table.device and copy.dtype == table.dtype
    for t in range(12):
        assert torch.equal(copy[t], table[t % 5])  # Longformer: tile the learned rows
    zeros = extend_table(table, 7, init="zeros")
    assert torch.equal(zeros[:5], table) and (zeros[5:] == 0).all()
    normal = extend_table(table.double(), 20005, init="normal", std=0.3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(normal[:5], table.double()) and normal.dtype == torch.float64
    assert normal[5:].std().item() == pytest.approx(0.3, rel=0.02)
    assert torch.equal(extend_table(table, 5), table)


def test_extend_table_validation():
    with pytest.raises(ValueError, match=r"num_positions must be an int >= the table's 5 rows, got 4"):
        extend_table(torch.zeros(5, 2), 4)
    with pytest.raises(ValueError, match="init must be one of .*, got 'uniform'"):
        extend_table(torch.zeros(5, 2), 6, init="uniform")
    with pytest.raises(ValueError, match="std must be a positive number, got 0"):
        extend_table(torch.zeros(5, 2), 6, init="normal", std=0)
    with pytest.raises(TypeError, match="table must be a floating-point tensor"):
        extend_table(torch.zeros(5, 2, dtype=torch.long), 6)


def test_interpolate_table_reads_the_table_between_its_rows(device):
    table = torch.randn(5, 3, device=device, dtype=torch.float32)
    twice = interpolate_table(table, 9)  # s = t / 2: the even rows are the old rows, the odd ones midpoints
    assert twice.shape == (9, 3) and twice.device == table.device and twice.dtype == table.dtype
    torch.testing.assert_close(twice[0::2], table)
    torch.testing.assert_close(twice[1::2], (table[:-1] + table[1:]) / 2)
    # a linear table stays on its line, to float64 rounding: row t of the result is a + b t (N - 1) / (N' - 1)
    a, b = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    line = a + b * torch.arange(128, dtype=torch.float64).unsqueeze(1)  # (128, 3)
    expected = a + b * (torch.arange(256, dtype=torch.float64) * 127 / 255).unsqueeze(1)
    torch.testing.assert_close(interpolate_table(line, 256), expected, atol=1e-12, rtol=1e-12)
    assert torch.equal(interpolate_table(table, 5), table)  # same length: unchanged
    torch.testing.assert_close(interpolate_table(table, 3), table[0::2])  # shorter: every other row


def test_interpolate_table_validation():
    with pytest.raises(ValueError, match=r"num_positions must be an int >= 2, got 1"):
        interpolate_table(torch.zeros(5, 2), 1)
    with pytest.raises(ValueError, match="table must have at least 2 rows to interpolate between, got 1"):
        interpolate_table(torch.zeros(1, 2), 4)
    with pytest.raises(TypeError, match="table must be a floating-point tensor"):
        interpolate_table(torch.zeros(5, 2, dtype=torch.long), 6)


def test_learned_extended_is_a_new_module_covering_more_positions():
    m = LearnedPE(4, 3)
    grown = m.extended(10, init="copy")
    assert isinstance(grown, LearnedPE) and grown.max_positions == 10 and m.max_positions == 4
    assert grown.weight is not m.weight and grown.weight.requires_grad
    torch.testing.assert_close(grown.table()[:4], m.table())
    x = torch.zeros(1, 2, 3)
    torch.testing.assert_close(grown.transform_input(x, torch.tensor([8, 9]))[0], m.table()[[0, 1]].detach())
    with pytest.raises(ValueError, match="max_positions=10"):
        grown.transform_input(x[:, :1], torch.tensor([10]))
    with pytest.raises(ValueError, match="max_positions=4"):
        m.transform_input(x[:, :1], torch.tensor([4]))


def test_low_rank_module(device):
    torch.manual_seed(0)
    m = LowRankPE(512, 64, rank=4, std=0.05).to(device)
    p = m.table().detach()
    assert torch.linalg.matrix_rank(p.cpu()).item() == 4  # numerical rank at the tolerance of float32
    assert sum(q.numel() for q in m.parameters()) == 4 * (512 + 64)
    assert abs(p.std().item() - 0.05) < 0.01
    x = torch.zeros(1, 3, 64, device=device)
    pos = torch.tensor([0, 100, 511], device=device)
    torch.testing.assert_close(m.transform_input(x, pos)[0], p[pos])
    with pytest.raises(ValueError, match=r"rank must be <= min\(num_positions, dim\) = 64, got 65"):
        LowRankPE(512, 64, rank=65)


def test_hybrid_starts_sinusoidal_and_learns_a_residual():
    m = HybridPE(16, 8, scale=0.1)
    x = torch.randn(2, 16, 8)
    pos = torch.arange(16)
    torch.testing.assert_close(m.transform_input(x, pos), x + 0.1 * sinusoidal_table(16, 8))
    torch.testing.assert_close(m.table(), 0.1 * sinusoidal_table(16, 8))
    m.transform_input(x, pos).pow(2).sum().backward()
    assert m.learned.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="max_positions=16"):
        m.transform_input(x[:, :1], torch.tensor([16]))


def test_module_validation():
    with pytest.raises(ValueError, match="init must be one of"):
        LearnedPE(4, 4, init="xavier")
    with pytest.raises(ValueError, match="num_positions must be a positive int, got 0"):
        LearnedPE(0, 4)
    with pytest.raises(ValueError, match="std must be a positive number"):
        LearnedPE(4, 4, std=-1.0)
    with pytest.raises(ValueError, match="rank must be a positive int"):
        LowRankPE(4, 4, rank=0)
    with pytest.raises(ValueError, match="scale must be a positive number"):
        SinusoidalPE(8, scale=0)
    with pytest.raises(ValueError, match="x has width 6 but this method was built for dim=8"):
        SinusoidalPE(8).transform_input(torch.zeros(1, 2, 6), torch.arange(2))


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "hybrid"])
def test_registered_methods_train_in_the_tiny_lm(name):
    cfg = LMConfig(d_model=16, n_head=2, n_layer=1, max_len=12)
    model = TinyLM(cfg, name)
    idx = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    model(idx).sum().backward()
    assert not torch.allclose(model(idx), TinyLM(cfg, "nope")(idx))
    method = build_method(name, cfg)
    if name == "sinusoidal":
        rms = method.table(1000).pow(2).mean().sqrt().item()
        assert rms == pytest.approx(0.02, rel=0.02)  # matched to the token embeddings' std
    else:
        with pytest.raises(ValueError, match=r"max_positions=12"):
            model(torch.zeros(1, 13, dtype=torch.long))


# --- regularisers ------------------------------------------------------------------------------


def test_l2_and_difference_penalties_match_loops():
    p = torch.randn(7, 5, dtype=torch.float64)
    assert l2_penalty(p).item() == pytest.approx(sum(float(x) ** 2 for x in p.flatten()))
    assert l2_penalty(p).item() == pytest.approx(torch.linalg.matrix_norm(p).item() ** 2)
    expected = sum(float(((p[i + 1] - p[i]) ** 2).sum()) for i in range(6))
    assert difference_penalty(p).item() == pytest.approx(expected)
    assert difference_penalty(p[:1]).item() == 0.0
    smooth = sinusoidal_table(100, 8, dtype=torch.float64)
    rough = smooth[torch.randperm(100, generator=torch.Generator().manual_seed(0))]
    assert difference_penalty(smooth) < difference_penalty(rough)  # same rows, shuffled: rougher


def test_spectral_penalty_matches_numpy_and_is_differentiable():
    p = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    sigma = np.linalg.svd(p.detach().numpy(), compute_uv=False)
    assert spectral_penalty(p, eps=1e-2).item() == pytest.approx(float((1 / (sigma**2 + 1e-2)).sum()))
    spectral_penalty(p).backward()
    assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    low_rank = torch.randn(9, 1, dtype=torch.float64) @ torch.randn(1, 4, dtype=torch.float64)
    assert spectral_penalty(low_rank) > spectral_penalty(p.detach())  # penalises near-singular tables
    assert spectral_penalty(p.detach().float()).dtype == torch.float32


def test_penalty_validation():
    with pytest.raises(TypeError, match="table must be a floating-point tensor, got torch.int64"):
        l2_penalty(torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"table must be a non-empty 2-D \(N, C\) tensor, got shape \(3,\)"):
        difference_penalty(torch.ones(3))
    with pytest.raises(ValueError, match="eps must be a positive number, got 0"):
        spectral_penalty(torch.ones(3, 3), eps=0)
