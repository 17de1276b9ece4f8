"""Tests of posenc.relative.t5: T5's relative buckets and bias."""

import math

import numpy as np
import pytest
import torch

from posenc.attention import materialize_bias
from posenc.relative import T5RelativeBias, t5_relative_bucket


def bucket_by_rule(r: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's rule written for one relative position r = key - query (Raffel et al. 2020; Mesh TensorFlow)."""
    n, ret = num_buckets, 0
    if bidirectional:
        n //= 2
        if r > 0:
            ret = n
        d = abs(r)
    else:
        d = max(-r, 0)
    exact = n // 2
    if d < exact:
        return ret + d
    log_ratio = np.float32(np.log(np.float32(d) / np.float32(exact))) / np.float32(math.log(max_distance / exact))
    return ret + min(exact + int(np.float32(log_ratio) * np.float32(n - exact)), n - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (64, 256), (16, 64), (4, 8)])
def test_buckets_follow_the_rule(bidirectional, num_buckets, max_distance):
    r = torch.arange(-300, 301)
    got = t5_relative_bucket(r, bidirectional, num_buckets, max_distance)
    expected = [bucket_by_rule(int(x), bidirectional, num_buckets, max_distance) for x in r]
    assert got.tolist() == expected
    assert got.min() >= 0 and got.max() <= num_buckets - 1
    # every bucket is used, except, when bidirectional, the upper half's "distance 0" (r = 0 is in the lower half)
    assert set(got.tolist()) == set(range(num_buckets)) - ({num_buckets // 2} if bidirectional else set())


def test_frozen_values_encoder_defaults():
    past = t5_relative_bucket(-torch.arange(1, 21), True, 32, 128).tolist()
    future = t5_relative_bucket(torch.arange(1, 21), True, 32, 128).tolist()
    assert past == [1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 10]
    assert future == [16 + b for b in past]
    assert t5_relative_bucket(torch.tensor([0, -127, -128, -1000, 1000]), True, 32, 128).tolist() == [0, 15, 15, 15, 31]


def test_frozen_values_decoder_defaults():
    got = t5_relative_bucket(-torch.arange(0, 24), False, 32, 128).tolist()
    assert got[:16] == list(range(16)) and got[16:] == [16, 16, 16, 17, 17, 18, 18, 18]
    assert t5_relative_bucket(torch.tensor([1, 50]), False, 32, 128).tolist() == [0, 0]  # future keys: bucket 0


def test_buckets_grow_with_distance_in_each_direction():
    d = torch.arange(0, 2000)
    for sign in (-1, 1):
        b = t5_relative_bucket(sign * d, True, 32, 128)
        assert (b[1:] >= b[:-1]).all()


def test_shape_dtype_and_device_are_kept(device):
    r = torch.arange(-6, 6, device=device, dtype=torch.int32).view(3, 4)
    b = t5_relative_bucket(r)
    assert b.shape == (3, 4) and b.dtype == torch.int64 and b.device == r.device


def test_bucket_validation():
    r = torch.arange(3)
    with pytest.raises(TypeError, match="relative_position must be an integer tensor"):
        t5_relative_bucket(r.float())
    with pytest.raises(TypeError, match="bidirectional must be a bool"):
        t5_relative_bucket(r, bidirectional=1)
    with pytest.raises(ValueError, match="num_buckets must be even when bidirectional"):
        t5_relative_bucket(r, True, 33)
    with pytest.raises(ValueError, match="num_buckets must be an int >= 4"):
        t5_relative_bucket(r, True, 2)
    with pytest.raises(ValueError, match="num_buckets must be an int >= 2"):
        t5_relative_bucket(r, False, 1)
    with pytest.raises(ValueError, match="num_buckets must be an int >= 4"):
        t5_relative_bucket(r, True, -32)
    with pytest.raises(ValueError, match="max_distance must be an int greater than the exact range 8"):
        t5_relative_bucket(r, True, 32, 8)
    t5_relative_bucket(r, True, 32, 9)  # just above the exact range is allowed


def test_bias_is_the_table_entry_of_each_bucket(device):
    torch.manual_seed(0)
    m = T5RelativeBias(3, num_buckets=8, max_distance=16, bidirectional=True, std=1.0).to(device).double()
    qp, kp = torch.arange(5, 9, device=device), torch.arange(9, device=device)
    q = torch.zeros(1, 3, 4, 2, dtype=torch.float64, device=device)
    k = torch.zeros(1, 3, 9, 2, dtype=torch.float64, device=device)
    bias = m.attention_bias(q, k, qp, kp, layer=0)
    for i in range(4):
        for j in range(9):
            b = bucket_by_rule(int(kp[j] - qp[i]), True, 8, 16)
            for h in range(3):
                assert bias[0, h, i, j] == m.weight[0, b, h]
    torch.testing.assert_close(materialize_bias(m.attention_bias_fn(q, k, qp, kp, 0), 1, 3, 4, 9, device=device), bias)
    # one table for every layer, unless per_layer
    assert torch.equal(m.attention_bias(q, k, qp, kp, layer=1), bias)
    per = T5RelativeBias(3, num_buckets=8, max_distance=16, per_layer=True, num_layers=2, std=1.0).double()
    assert not torch.equal(per.attention_bias(q.cpu(), k.cpu(), qp.cpu(), kp.cpu(), 0),
                           per.attention_bias(q.cpu(), k.cpu(), qp.cpu(), kp.cpu(), 1))


def test_gradient_reaches_only_the_buckets_in_use():
    m = T5RelativeBias(2, num_buckets=32, max_distance=128, bidirectional=False)
    pos = torch.arange(10)
    q = torch.zeros(1, 2, 10, 4)
    m.attention_bias(q, q, pos, pos, 0).sum().backward()
    used = set(t5_relative_bucket(pos[None, :] - pos[:, None], False, 32, 128).flatten().tolist())
    nonzero = {b for b in range(32) if m.weight.grad[0, b].abs().sum() > 0}
    assert nonzero == used == set(range(10))


def test_module_validation():
    with pytest.raises(ValueError, match="num_heads must be an int >= 1"):
        T5RelativeBias(0)
    with pytest.raises(ValueError, match="max_distance must be an int greater than the exact range"):
        T5RelativeBias(4, num_buckets=32, max_distance=4)
