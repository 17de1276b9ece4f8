"""Tests of posenc.lab.lm: the tiny LM, its configuration, and the next-token loss."""

import pytest
import torch
import torch.nn.functional as F

from posenc.lab.lm import LMConfig, TinyLM, next_token_loss
from posenc.method import NoPE, PositionMethod
from posenc.naive import BinaryPE

SMALL = dict(d_model=16, n_head=2, n_layer=2, max_len=16)


def test_forward_shapes_and_dtype(device):
    model = TinyLM(LMConfig(**SMALL)).to(device)
    idx = torch.randint(0, 256, (3, 10), device=device)
    logits = model(idx)
    assert logits.shape == (3, 10, 256) and logits.device.type == device.type
    logits, weights = model(idx, return_weights=True)
    assert len(weights) == 2 and weights[0].shape == (3, 2, 10, 10)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(3, 2, 10, device=device))


def test_float64_and_bfloat16(device):
    idx = torch.randint(0, 256, (2, 6), device=device)
    m64 = TinyLM(LMConfig(**SMALL), "binary").to(device).double()
    assert m64(idx).dtype == torch.float64
    mbf = TinyLM(LMConfig(**SMALL), "binary").to(device).bfloat16()
    out = mbf(idx)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), m64(idx), atol=0.1, rtol=0.1)


def test_backends_give_the_same_model():
    idx = torch.randint(0, 256, (2, 12))
    a = TinyLM(LMConfig(**SMALL, attn_backend="reference")).double()
    b = TinyLM(LMConfig(**SMALL, attn_backend="sdpa")).double()
    torch.testing.assert_close(a(idx), b(idx))


def test_seeded_initialisation_is_local():
    torch.manual_seed(123)
    before = torch.rand(1)
    a, b = TinyLM(LMConfig(**SMALL, seed=7)), TinyLM(LMConfig(**SMALL, seed=7))
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), before)  # the global RNG was not advanced by construction
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    c = TinyLM(LMConfig(**SMALL, seed=8))
    assert not torch.equal(a.tok.weight, c.tok.weight)


def test_causality_future_tokens_do_not_change_past_logits():
    model = TinyLM(LMConfig(**SMALL), "integer")
    idx = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 256
    torch.testing.assert_close(model(idx)[:, :8], model(changed)[:, :8])
    assert not torch.allclose(model(idx)[:, 8:], model(changed)[:, 8:])


def test_nope_lm_is_invariant_to_a_permutation_of_the_prefix_in_one_layer_only():
    """With one layer, a NoPE causal LM's last output depends on the *set* of earlier tokens; with two, on their order."""
    idx = torch.tensor([[5, 9, 200, 33, 71, 12]])
    perm = torch.tensor([2, 0, 4, 1, 3, 5])  # keeps the last token in place
    one = TinyLM(LMConfig(**{**SMALL, "n_layer": 1})).double()
    torch.testing.assert_close(one(idx[:, perm])[:, -1], one(idx)[:, -1])
    two = TinyLM(LMConfig(**SMALL)).double()
    assert not torch.allclose(two(idx[:, perm])[:, -1], two(idx)[:, -1])


def test_weight_tying_and_parameter_count():
    model = TinyLM(LMConfig(**SMALL))
    assert model.head.weight is model.tok.weight
    c = SMALL["d_model"]
    per_block = 4 * c * c + 2 * 4 * c * c + 2 * 2 * c  # attention, MLP, two LayerNorms
    assert model.num_parameters() == 256 * c + SMALL["n_layer"] * per_block + 2 * c


def test_method_parameters_are_part_of_the_model():
    class Learned(PositionMethod):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.zeros(16, 16))

        def transform_input(self, x, positions):
            return x + self.table[positions]

    model = TinyLM(LMConfig(**SMALL), Learned())
    assert any(p is model.position.table for p in model.parameters())


def test_positions_argument_and_limits():
    model = TinyLM(LMConfig(**SMALL), BinaryPE(16, num_bits=3))
    idx = torch.randint(0, 256, (1, 4))
    out = model(idx, positions=torch.tensor([4, 5, 6, 7]))
    assert out.shape == (1, 4, 256)
    with pytest.raises(ValueError, match=r"only covers positions 0..7 \(max_positions=8\)"):
        model(idx, positions=torch.tensor([5, 6, 7, 8]))
    with pytest.raises(ValueError, match="positions has 3 entries but idx has T=4"):
        model(idx, positions=torch.arange(3))


def test_input_validation():
    model = TinyLM(LMConfig(**SMALL))
    with pytest.raises(TypeError, match="idx must be an integer tensor"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"idx must have shape \(B, T\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"idx must be in 0..255, got range 0..256"):
        model(torch.tensor([[0, 256]]))
    with pytest.raises(TypeError, match="position must be a PositionMethod or a registered name, got int"):
        TinyLM(LMConfig(**SMALL), 3)
    with pytest.raises(TypeError, match="config must be an LMConfig"):
        TinyLM(dict(SMALL))
    with pytest.raises(ValueError, match="unknown position method 'nada'"):
        TinyLM(LMConfig(**SMALL), "nada")


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("d_model", 0, "LMConfig.d_model must be a positive int, got 0"),
        ("n_layer", 1.5, "LMConfig.n_layer must be a positive int, got 1.5"),
        ("n_head", 3, "LMConfig.n_head=3 must divide d_model=16"),
        ("dropout", 1.0, r"LMConfig.dropout must be in \[0, 1\), got 1.0"),
        ("attn_backend", "flash", "LMConfig.attn_backend must be one of"),
    ],
)
def test_config_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        LMConfig(**{**SMALL, field: value})


def test_next_token_loss_matches_cross_entropy():
    logits = torch.randn(2, 5, 11, dtype=torch.float64)
    targets = torch.randint(0, 11, (2, 5))
    per = next_token_loss(logits, targets, reduction="none")
    assert per.shape == (2, 5)
    expected = torch.stack([F.cross_entropy(logits[b], targets[b], reduction="none") for b in range(2)])
    torch.testing.assert_close(per, expected)
    torch.testing.assert_close(next_token_loss(logits, targets), expected.mean())
    assert next_token_loss(logits.bfloat16(), targets).dtype == torch.float32
    with pytest.raises(ValueError, match=r"disagree on \(B, T\)"):
        next_token_loss(logits, targets[:, :4])
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'none'"):
        next_token_loss(logits, targets, reduction="sum")


def test_uniform_logits_give_log_vocab():
    logits = torch.zeros(1, 3, 256)
    torch.testing.assert_close(next_token_loss(logits, torch.zeros(1, 3, dtype=torch.long)), torch.log(torch.tensor(256.0)))


def test_nope_model_has_no_position_parameters():
    assert list(NoPE().parameters()) == []


def test_logn_scaling_changes_nothing_up_to_L_and_only_later_positions_past_it():
    """LMConfig.logn_length: same logits (bit for bit) on windows of at most L tokens; on longer
    windows the first L positions are unchanged (causal) and the later ones differ."""
    L = 8
    plain = TinyLM(LMConfig(**SMALL), "rope")
    logn = TinyLM(LMConfig(**SMALL, logn_length=L), "rope")
    idx = torch.randint(0, 256, (2, 16))
    assert torch.equal(plain(idx[:, :L]), logn(idx[:, :L]))
    a, b = plain(idx), logn(idx)
    assert torch.equal(a[:, :L], b[:, :L]) and not torch.allclose(a[:, L:], b[:, L:])
    with pytest.raises(ValueError, match=r"LMConfig.logn_length must be None \(off\) or an int >= 2 .*got 1"):
        LMConfig(**SMALL, logn_length=1)
