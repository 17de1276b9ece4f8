"""Tests of posenc.method: the position-method interface and the table of methods."""

import pytest
import torch

import posenc
from posenc.lab.lm import LMConfig, TinyLM
from posenc.method import METHODS, NoPE, PositionMethod, build_method, check_positions, register_method


def test_registry_holds_the_chapter_1_methods():
    assert {"nope", "integer", "normalized", "binary"} <= set(METHODS)
    cfg = LMConfig(d_model=16, n_head=2)
    for name in METHODS:
        assert isinstance(build_method(name, cfg), PositionMethod)


def test_build_unknown_method_lists_registered_names():
    with pytest.raises(ValueError, match=r"unknown position method 'rope2'; registered methods: \[.*'nope'"):
        build_method("rope2", LMConfig())


def test_register_twice_is_an_error():
    with pytest.raises(ValueError, match="'nope' is already registered"):
        register_method("nope")(lambda cfg: NoPE())


def test_nope_is_the_identity_at_every_hook():
    m = NoPE()
    x, q, k = torch.randn(2, 4, 8), torch.randn(2, 2, 4, 4), torch.randn(2, 2, 6, 4)
    pos, kpos = torch.arange(4), torch.arange(6)
    assert m.transform_input(x, pos) is x
    assert m.transform_qk(q, k, pos, kpos, 0) == (q, k)
    assert m.attention_bias(q, k, pos, kpos, 0) is None
    assert m.max_positions is None


class InputShift(PositionMethod):
    def transform_input(self, x, positions):
        return x + positions[:, None].to(x.dtype)


class QueryScale(PositionMethod):
    def transform_qk(self, q, k, q_positions, k_positions, layer):
        return q * (1.0 + q_positions[:, None].to(q.dtype)), k


class DistanceBias(PositionMethod):
    def attention_bias(self, q, k, q_positions, k_positions, layer):
        return (k_positions[None, :] - q_positions[:, None]).to(q.dtype)  # key - query


@pytest.mark.parametrize("method_cls", [InputShift, QueryScale, DistanceBias])
def test_each_hook_changes_the_model(method_cls):
    """Position can enter at each of the three places (source 002 §1.3), through one interface."""
    cfg = LMConfig(d_model=16, n_head=2, n_layer=1, max_len=8)
    idx = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    base = TinyLM(cfg, NoPE())
    model = TinyLM(cfg, method_cls())
    model.load_state_dict(base.state_dict())
    assert not torch.allclose(model(idx), base(idx))


def test_check_positions_rules():
    check_positions(torch.arange(5), max_positions=5)
    check_positions(torch.zeros(0, dtype=torch.long))
    with pytest.raises(TypeError, match="positions must be an integer tensor, got torch.float32"):
        check_positions(torch.arange(3.0))
    with pytest.raises(TypeError, match="must be an integer tensor, got list"):
        check_positions([0, 1])
    with pytest.raises(TypeError, match="got torch.bool"):
        check_positions(torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"must be 1-D \(N,\), got shape \(1, 3\)"):
        check_positions(torch.arange(3)[None])
    with pytest.raises(ValueError, match="must be non-negative, got minimum -1"):
        check_positions(torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"maximum 5, but this method only covers positions 0..4 \(max_positions=5\)"):
        check_positions(torch.arange(6), max_positions=5)


def test_package_exports():
    for name in posenc.__all__:
        assert hasattr(posenc, name)
    assert posenc.__version__
