"""Parity with Hugging Face's implementations, which T5 and DeBERTa checkpoints are used with.

Runs only where `transformers` is installed (it is not a dependency of posenc); skipped otherwise.
"""

import pytest
import torch

from posenc.relative import deberta_log_bucket, t5_relative_bucket

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 256), (16, 64), (4, 8)])
def test_t5_buckets_match_transformers(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-3000, 3001)  # key - query, as in T5Attention.compute_bias
    ours = t5_relative_bucket(relative, bidirectional, num_buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("bucket_size,max_position", [(256, 512), (32, 128), (8, 64)])
def test_deberta_log_buckets_match_transformers(bucket_size, max_position):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    relative = torch.arange(-2000, 2001)
    assert torch.equal(deberta_log_bucket(relative, bucket_size, max_position), make_log_bucket_position(relative, bucket_size, max_position).long())


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_bias_is_transformers_compute_bias(is_decoder):
    # the functional bias takes transformers' weight as it is, (num_buckets, H), and reproduces
    # T5Attention.compute_bias; with per-row positions it gives each row its own matrix
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    from posenc.relative import t5_bias

    config = T5Config(d_model=32, d_kv=8, num_heads=4, relative_attention_num_buckets=32,
                      relative_attention_max_distance=128, is_decoder=is_decoder)
    attn = T5Attention(config, has_relative_attention_bias=True)
    torch.nn.init.normal_(attn.relative_attention_bias.weight)
    with torch.no_grad():
        expected = attn.compute_bias(40, 300)  # (1, H, T, S): queries at 0..39, keys at 0..299
        ours = t5_bias(attn.relative_attention_bias.weight, torch.arange(40), torch.arange(300),
                       bidirectional=not is_decoder, max_distance=128)
        assert torch.equal(ours, expected[0])
        rows = torch.stack([torch.arange(40), torch.arange(40) + 7])  # (B, T): the second row starts at 7
        per_row = t5_bias(attn.relative_attention_bias.weight, rows, rows, bidirectional=not is_decoder)
    assert per_row.shape == (2, 4, 40, 40)
    assert torch.equal(per_row[0], per_row[1])  # relative: a shift of both changes nothing
    with pytest.raises(ValueError, match=r"weight must have shape \(num_buckets, H\)"):
        t5_bias(torch.zeros(1, 32, 4), torch.arange(3), torch.arange(3))
