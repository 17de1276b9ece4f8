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
