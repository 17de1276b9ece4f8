"""Tests of posenc.recursive: the linear FLOATER-style recurrence and the multiplicative encoding."""

import pytest
import torch

from posenc.absolute import SinusoidalPE, offset_matrix, sinusoidal_table
from posenc.lab.lm import LMConfig, TinyLM
from posenc.recursive import MultiplicativePE, RecurrentPE, recurrent_codes, sinusoidal_generator


def test_generator_is_skew_and_exponentiates_to_the_one_step_offset():
    s = sinusoidal_generator(8)
    torch.testing.assert_close(s, -s.T)
    torch.testing.assert_close(torch.linalg.matrix_exp(s), offset_matrix(1, 8), atol=1e-12, rtol=0)


def test_recurrent_codes_equal_repeated_one_step_recurrence():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=g, dtype=torch.float64) * 0.3
    s, p0 = a - a.T, torch.randn(6, generator=g, dtype=torch.float64)
    step = torch.linalg.matrix_exp(s)
    rows = [p0]
    for _ in range(39):
        rows.append(step @ rows[-1])
    torch.testing.assert_close(recurrent_codes(p0, s, torch.arange(40)), torch.stack(rows), atol=1e-10, rtol=0)
    norms = recurrent_codes(p0, s, torch.tensor([0, 7, 1000])).norm(dim=1)
    torch.testing.assert_close(norms, p0.norm().expand(3))  # a skew generator preserves the norm


def test_recurrent_pe_starts_as_the_sinusoidal_table(device):
    m = RecurrentPE(16, scale=0.5).to(device)
    pos = torch.arange(64, device=device)
    torch.testing.assert_close(m.codes(pos).cpu(), 0.5 * sinusoidal_table(64, 16, dtype=torch.float64), atol=1e-5, rtol=0)
    x = torch.randn(2, 64, 16, device=device)
    torch.testing.assert_close(m.transform_input(x, pos), SinusoidalPE(16, scale=0.5).transform_input(x, pos), atol=1e-5, rtol=0)


def test_recurrent_pe_learns_both_start_and_generator():
    m = RecurrentPE(8)
    m.transform_input(torch.randn(1, 5, 8), torch.arange(5)).pow(2).sum().backward()
    assert m.p0.grad.abs().sum() > 0 and m.a.grad.abs().sum() > 0
    torch.testing.assert_close(m.generator(), -m.generator().T)


def test_multiplicative_pe(device):
    m = MultiplicativePE(8, scale=0.25)
    x = torch.randn(2, 5, 8, dtype=torch.float64, device=device)
    pos = torch.arange(5, device=device)
    expected = x * (1 + 0.25 * sinusoidal_table(5, 8, dtype=torch.float64).to(device))
    torch.testing.assert_close(m.transform_input(x, pos), expected)
    f = m.factors(torch.arange(1000))
    assert f.min() >= 0.75 and f.max() <= 1.25
    assert m.transform_input(x.float(), pos).dtype == torch.float32


def test_validation():
    with pytest.raises(ValueError, match=r"scale must be in \(0, 1\] so that no factor changes sign, got 1.5"):
        MultiplicativePE(8, scale=1.5)
    with pytest.raises(ValueError, match="dim must be a positive even int, got 5"):
        RecurrentPE(5)
    with pytest.raises(ValueError, match="x has width 4 but this method was built for dim=8"):
        RecurrentPE(8).transform_input(torch.zeros(1, 2, 4), torch.arange(2))
    with pytest.raises(ValueError, match="positions must be non-negative"):
        RecurrentPE(8).codes(torch.tensor([-1]))


@pytest.mark.parametrize("name", ["recurrent", "multiplicative"])
def test_registered_methods_run_in_the_tiny_lm(name):
    cfg = LMConfig(d_model=16, n_head=2, n_layer=1, max_len=12)
    model = TinyLM(cfg, name)
    idx = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    model(idx).sum().backward()
    assert not torch.allclose(model(idx), TinyLM(cfg, "nope")(idx))
