"""Parity of posenc.alibi with the ALiBi code that Hugging Face runs BLOOM and MPT checkpoints with.

Both build a *key-only* bias ``slope * key_position`` (MPT: relative to the last key), which differs
from ALiBi's ``slope * (key - query)`` by a constant per query row and so gives the same softmax.
Runs only where `transformers` is installed (it is not a dependency of posenc); skipped otherwise.
"""

import pytest
import torch

from posenc.alibi import alibi_bias, alibi_slopes, positions_from_padding_mask
from posenc.attention import attention

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("n", range(1, 65))
def test_slopes_equal_mpt_bitwise(n):
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    mpt = build_mpt_alibi_tensor(n, 2)  # (H, 1, 2): slope * (key - last key) = [-slope, 0]
    assert torch.equal(-mpt[:, 0, 0], alibi_slopes(n))
    assert torch.equal(mpt[:, 0, :], alibi_bias(alibi_slopes(n), torch.tensor([1]), torch.arange(2))[:, 0, :])


@pytest.mark.parametrize("n", range(1, 65))
def test_slopes_equal_bloom_to_fp32_rounding(n):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    bloom = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n, torch.float32)  # (H, 1, 2) = slope * [0, 1]
    # BLOOM's port raises an fp32-rounded base to integer powers in fp32: up to 5.1e-7 relative off
    # the correctly rounded slope that posenc (and MPT) return; bitwise equal for n <= 10.
    torch.testing.assert_close(bloom[:, 0, 1], alibi_slopes(n), rtol=6e-7, atol=0)
    if n <= 10:
        assert torch.equal(bloom[:, 0, 1], alibi_slopes(n))


def test_bloom_left_padded_bias_gives_the_same_attention(device):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    torch.manual_seed(0)
    B, H, S, D = 2, 6, 10, 8
    hf_mask = torch.ones(B, S, dtype=torch.long)
    hf_mask[1, :4] = 0  # row 1 left-padded
    pad = (hf_mask == 0).to(device)
    bloom = build_alibi_tensor(hf_mask, H, torch.float64).view(B, H, 1, S).to(device)  # key-only
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64, device=device) for _ in range(3))
    pos = positions_from_padding_mask(pad)  # (B, S)
    ours = alibi_bias(alibi_slopes(H), pos, pos).double()  # (B, H, S, S)
    a = attention(q, k, v, bias=bloom, causal=True, key_padding_mask=pad)
    b = attention(q, k, v, bias=ours, causal=True, key_padding_mask=pad)
    torch.testing.assert_close(a[:, :, 4:], b[:, :, 4:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_heads", [1, 3, 4, 6, 12, 16, 24, 40, 64, 112])
def test_transformers_arithmetic_gives_blooms_slopes_bit_for_bit(num_heads):
    # BLOOM's code raises an fp32 ratio to integer powers (test above: up to 5.1e-7 off the exact slopes);
    # arithmetic="transformers" does the same
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    assert torch.equal(alibi_slopes(num_heads, arithmetic="transformers"), _get_alibi_slopes(num_heads, "cpu"))
