"""Tests of posenc.naive: integer, normalised and binary position codes and their methods."""

import pytest
import torch
import torch.nn.functional as F

from posenc.lab.lm import LMConfig, TinyLM
from posenc.method import PositionMethod, build_method
from posenc.naive import (
    DIRECTIONS,
    BinaryPE,
    IntegerPE,
    NormalizedPE,
    binary_code,
    integer_code,
    normalized_code,
)

FP64 = dict(rtol=1e-12, atol=1e-12)
EXACT = dict(rtol=0, atol=0)


def signs(dim: int, direction: str) -> list[float]:
    return [1.0] * dim if direction == "ones" else [1.0 if j % 2 == 0 else -1.0 for j in range(dim)]


# --- integer_code --------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_integer_code_matches_a_naive_loop(device, direction):
    positions = torch.tensor([0, 1, 2, 7, 100, 4095], device=device)
    dim = 5
    code = integer_code(positions, dim, direction=direction, dtype=torch.float64)
    assert code.shape == (6, dim) and code.dtype == torch.float64 and code.device.type == device.type
    expected = [[float(t) * s for s in signs(dim, direction)] for t in positions.tolist()]
    torch.testing.assert_close(code.cpu(), torch.tensor(expected, dtype=torch.float64), **EXACT)


def test_integer_code_frozen_values():
    # the alternating direction starts with +: +t, -t, +t, ...
    assert integer_code(torch.tensor([3]), 4).tolist() == [[3.0, -3.0, 3.0, -3.0]]
    assert integer_code(torch.tensor([3]), 3, direction="ones").tolist() == [[3.0, 3.0, 3.0]]
    assert integer_code(torch.tensor([2]), 1).tolist() == [[2.0]]
    assert DIRECTIONS == ("alternating", "ones")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_integer_code_dtype(dtype):
    code = integer_code(torch.arange(8), 4, dtype=dtype)
    assert code.dtype == dtype
    expected = torch.arange(8.0, dtype=torch.float64)[:, None].expand(8, 4)
    torch.testing.assert_close(code.double().abs(), expected, **EXACT)


def test_integer_code_accepts_any_integer_dtype_and_empty_positions():
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.int16):
        assert integer_code(torch.arange(3, dtype=dtype), 2).tolist() == [[0.0, -0.0], [1.0, -1.0], [2.0, -2.0]]
    assert integer_code(torch.zeros(0, dtype=torch.long), 3).shape == (0, 3)


def test_integer_code_grows_without_bound():
    """The flaw chapter 1 shows: the code's norm grows linearly with the position."""
    code = integer_code(torch.tensor([1, 10, 1000]), 16, dtype=torch.float64)
    torch.testing.assert_close(code.norm(dim=1), torch.tensor([1.0, 10.0, 1000.0], dtype=torch.float64) * 4, **FP64)


def test_layer_norm_erases_the_ones_direction_but_not_the_alternating_one(device):
    d = 16
    x = torch.randn(12, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    t = torch.arange(0, 1200, 100, device=device)
    base = F.layer_norm(x, (d,))
    ones = F.layer_norm(x + integer_code(t, d, direction="ones", dtype=torch.float64), (d,))
    torch.testing.assert_close(ones, base, rtol=1e-9, atol=1e-9)  # t up to 1100: fp64 cancellation ~1e-13
    alt = F.layer_norm(x + integer_code(t, d, direction="alternating", dtype=torch.float64), (d,))
    assert (alt - base)[1:].abs().amax(dim=1).min() > 0.1  # every non-zero position changes the output
    torch.testing.assert_close(alt[0], base[0], **FP64)  # position 0 adds nothing
    # the alternating code has zero mean over coordinates for even d: LayerNorm keeps all of it
    zero = torch.zeros(12, dtype=torch.float64, device=device)
    torch.testing.assert_close(integer_code(t, d, dtype=torch.float64).mean(1), zero, **FP64)


def test_ones_direction_is_invisible_to_a_pre_ln_transformer():
    """Every LayerNorm of a pre-LN model sees the residual stream plus c(t) * ones: the model is NoPE."""
    cfg = LMConfig(d_model=16, n_head=2, n_layer=2, max_len=16)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    nope = TinyLM(cfg, "nope").double()
    ones = TinyLM(cfg, IntegerPE(16, direction="ones")).double()
    alt = TinyLM(cfg, IntegerPE(16, direction="alternating")).double()
    ones.load_state_dict(nope.state_dict())
    alt.load_state_dict(nope.state_dict())
    torch.testing.assert_close(ones(idx), nope(idx), rtol=1e-9, atol=1e-9)
    assert (alt(idx) - nope(idx)).abs().max() > 1e-3


# --- normalized_code -----------------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_normalized_code_matches_a_naive_loop(device, direction):
    length, dim = 9, 6
    positions = torch.tensor([0, 3, 4, 8], device=device)
    code = normalized_code(positions, dim, length, direction=direction, dtype=torch.float64)
    assert code.shape == (4, dim) and code.dtype == torch.float64 and code.device.type == device.type
    expected = [[t / (length - 1) * s for s in signs(dim, direction)] for t in positions.tolist()]
    torch.testing.assert_close(code.cpu(), torch.tensor(expected, dtype=torch.float64), **FP64)


def test_normalized_code_frozen_values_and_range():
    code = normalized_code(torch.arange(5), 2, 5)
    expected = torch.tensor([[0.0, -0.0], [0.25, -0.25], [0.5, -0.5], [0.75, -0.75], [1.0, -1.0]])
    torch.testing.assert_close(code, expected, **EXACT)
    code = normalized_code(torch.arange(100), 3, 100, direction="ones")
    assert float(code.min()) == 0.0 and float(code.max()) == 1.0  # first and last token: 0 and 1
    assert normalized_code(torch.tensor([0]), 4, 1).tolist() == [[0.0, 0.0, 0.0, 0.0]]  # length 1: code 0
    assert normalized_code(torch.arange(4), 4, 10, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_normalized_code_of_a_position_depends_on_the_length():
    t = torch.tensor([5])
    short = normalized_code(t, 4, 11, dtype=torch.float64)
    long = normalized_code(t, 4, 101, dtype=torch.float64)
    torch.testing.assert_close(short[0, 0], torch.tensor(0.5, dtype=torch.float64), **FP64)
    torch.testing.assert_close(long[0, 0], torch.tensor(0.05, dtype=torch.float64), **FP64)
    assert not torch.allclose(short, long)


# --- binary_code ---------------------------------------------------------------------------------


def test_binary_code_frozen_values():
    # least significant bit first: 5 = 0b101 -> [1, 0, 1, 0]
    assert binary_code(torch.tensor([5]), 4).tolist() == [[1.0, 0.0, 1.0, 0.0]]
    assert binary_code(torch.tensor([6]), 4).tolist() == [[0.0, 1.0, 1.0, 0.0]]
    assert binary_code(torch.tensor([0, 15]), 4).tolist() == [[0.0] * 4, [1.0] * 4]
    # zeros after num_bits
    assert binary_code(torch.tensor([3]), 5, num_bits=2).tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]


def test_binary_code_matches_python_format(device):
    dim = 12
    positions = torch.arange(2**dim, device=device)
    code = binary_code(positions, dim, dtype=torch.float64)
    assert code.shape == (2**dim, dim) and code.dtype == torch.float64 and code.device.type == device.type
    expected = [[float(c) for c in format(t, "b").zfill(dim)[::-1]] for t in range(2**dim)]
    torch.testing.assert_close(code.cpu(), torch.tensor(expected, dtype=torch.float64), **EXACT)


def test_binary_code_with_fewer_bits_than_dim(device):
    positions = torch.tensor([0, 1, 6, 7], device=device)
    code = binary_code(positions, 8, num_bits=3)
    assert code.dtype == torch.float32 and code.device.type == device.type
    expected = [[float(c) for c in format(t, "b").zfill(3)[::-1]] + [0.0] * 5 for t in [0, 1, 6, 7]]
    torch.testing.assert_close(code.cpu(), torch.tensor(expected), **EXACT)


def test_binary_code_large_positions_use_62_bits():
    t = 2**62 - 1 - 2**40  # not representable in fp32 or fp64 as an integer, but its bits are
    code = binary_code(torch.tensor([t]), 62)
    expected = [float(c) for c in format(t, "b").zfill(62)[::-1]]
    assert code[0].tolist() == expected


def test_binary_codes_are_distinct_and_consecutive_distance_is_one_plus_trailing_ones():
    dim = 10
    code = binary_code(torch.arange(2**dim), dim, dtype=torch.float64)
    assert torch.unique(code, dim=0).shape[0] == 2**dim
    flips = (code[1:] != code[:-1]).sum(1)  # Hamming distance of t and t + 1
    trailing_ones = [len(format(t, "b")) - len(format(t, "b").rstrip("1")) for t in range(2**dim - 1)]
    assert flips.tolist() == [1 + k for k in trailing_ones]
    # the Euclidean distance of neighbours is therefore not constant: sqrt(1 + trailing ones)
    dist = (code[1:] - code[:-1]).norm(dim=1)
    torch.testing.assert_close(dist, torch.tensor([1.0 + k for k in trailing_ones], dtype=torch.float64).sqrt(), **FP64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_binary_code_dtype(dtype):
    code = binary_code(torch.arange(16), 4, dtype=dtype)
    assert code.dtype == dtype
    torch.testing.assert_close(code.double(), binary_code(torch.arange(16), 4, dtype=torch.float64), **EXACT)


def test_binary_code_default_num_bits_works_for_any_valid_dim():
    # Regression test: num_bits once defaulted to dim although it must be <= 62, so any dim > 62
    # with the default raised "num_bits must be ... got 64" although the caller never passed
    # num_bits (binary_code(p, 64) and BinaryPE(64), i.e. LMConfig's default d_model, failed).
    # Now the default is min(dim, 62).
    code = binary_code(torch.arange(4), 64)
    assert code.shape == (4, 64)
    assert BinaryPE(64).dim == 64


# --- bad inputs of the three codes ---------------------------------------------------------------


CODES = {
    "integer": lambda p, dim=4, **kw: integer_code(p, dim, **kw),
    "normalized": lambda p, dim=4, **kw: normalized_code(p, dim, 1000, **kw),
    "binary": lambda p, dim=4, **kw: binary_code(p, dim, **kw),
}


@pytest.mark.parametrize("name", CODES)
def test_codes_reject_non_integer_positions(name):
    with pytest.raises(TypeError, match="positions must be an integer tensor, got torch.float32"):
        CODES[name](torch.arange(3.0))
    with pytest.raises(TypeError, match="positions must be an integer tensor, got list"):
        CODES[name]([0, 1])


@pytest.mark.parametrize("name", CODES)
def test_codes_reject_positions_that_are_not_1d(name):
    with pytest.raises(ValueError, match=r"positions must be 1-D \(N,\), got shape \(2, 3\)"):
        CODES[name](torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize("name", CODES)
def test_codes_reject_negative_positions(name):
    with pytest.raises(ValueError, match="positions must be non-negative, got minimum -2"):
        CODES[name](torch.tensor([0, -2]))


@pytest.mark.parametrize("name", CODES)
@pytest.mark.parametrize("dim", [0, -1, 2.0, True])
def test_codes_reject_bad_dim(name, dim):
    with pytest.raises(ValueError, match=rf"dim must be a positive int, got {dim!r}"):
        CODES[name](torch.arange(3), dim)


@pytest.mark.parametrize("name", ["integer", "normalized"])
def test_scalar_codes_reject_unknown_direction(name):
    with pytest.raises(ValueError, match=r"direction must be one of \('alternating', 'ones'\), got 'zeros'"):
        CODES[name](torch.arange(3), direction="zeros")


@pytest.mark.parametrize("length", [0, -5, 3.0, True])
def test_normalized_code_rejects_bad_length(length):
    with pytest.raises(ValueError, match=rf"length must be a positive int, got {length!r}"):
        normalized_code(torch.tensor([0]), 4, length)


def test_normalized_code_rejects_positions_not_below_length():
    with pytest.raises(ValueError, match="every position must be < length=5, got maximum 5"):
        normalized_code(torch.arange(6), 4, 5)


@pytest.mark.parametrize("num_bits, dim", [(0, 4), (5, 4), (63, 64), (2.0, 4)])
def test_binary_code_rejects_bad_num_bits(num_bits, dim):
    message = rf"num_bits must be an int in 1..min\(dim, 62\) = 1..{min(dim, 62)}, got {num_bits!r}"
    with pytest.raises(ValueError, match=message):
        binary_code(torch.arange(2), dim, num_bits=num_bits)


def test_binary_code_rejects_positions_beyond_num_bits():
    binary_code(torch.tensor([7]), 4, num_bits=3)  # 2**3 - 1 fits
    with pytest.raises(ValueError, match=r"position 8 needs more than num_bits=3 bits \(largest representable: 7\)"):
        binary_code(torch.tensor([1, 8]), 4, num_bits=3)
    with pytest.raises(ValueError, match="position 16 needs more than num_bits=4 bits"):
        binary_code(torch.tensor([16]), 4)  # default num_bits = dim


# --- the position methods ------------------------------------------------------------------------


def method_and_reference(name: str, dim: int, T: int, scale: float = 1.0):
    """A method and the code it should add, built from the pure functions in fp64."""
    t = torch.arange(T)
    if name == "integer":
        return IntegerPE(dim, scale=scale), scale * integer_code(t, dim, dtype=torch.float64)
    if name == "integer-ones":
        ref = scale * integer_code(t, dim, direction="ones", dtype=torch.float64)
        return IntegerPE(dim, direction="ones", scale=scale), ref
    if name == "normalized":
        return NormalizedPE(dim, scale=scale), scale * normalized_code(t, dim, T, dtype=torch.float64)
    if name == "binary":
        return BinaryPE(dim, num_bits=6, scale=scale), scale * binary_code(t, dim, num_bits=6, dtype=torch.float64)
    raise AssertionError(name)


METHOD_NAMES = ["integer", "integer-ones", "normalized", "binary"]


@pytest.mark.parametrize("name", METHOD_NAMES)
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_transform_input_adds_the_code_in_float64(device, name, scale):
    B, T, C = 2, 13, 8
    method, ref = method_and_reference(name, C, T, scale)
    x = torch.randn(B, T, C, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    out = method.transform_input(x, torch.arange(T, device=device))
    assert out.shape == x.shape and out.dtype == torch.float64 and out.device.type == device.type
    # the code is computed in fp32 (CONVENTIONS, Numerics) and then cast: fp32 tolerance
    torch.testing.assert_close(out - x, ref.to(device).expand(B, T, C), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_transform_input_keeps_bfloat16(device, name):
    B, T, C = 2, 13, 8
    method, ref = method_and_reference(name, C, T)
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    out = method.transform_input(x, torch.arange(T, device=device))
    assert out.dtype == torch.bfloat16 and out.device.type == device.type
    expected = (x.double() + ref.to(device)).to(torch.bfloat16)
    # one bf16 rounding of the code and one of the sum: 2 ulps of bf16 (2**-7 relative)
    torch.testing.assert_close(out.double(), expected.double(), rtol=2 * 2**-7, atol=2 * 2**-7)


def test_transform_input_accepts_positions_on_another_device(device):
    method = IntegerPE(4)
    x = torch.zeros(1, 3, 4, device=device)
    out = method.transform_input(x, torch.arange(3))  # CPU positions: moved to x's device
    assert out.device.type == device.type
    assert out[0, 2].tolist() == [2.0, -2.0, 2.0, -2.0]


def test_normalized_pe_takes_the_length_from_the_positions():
    x = torch.zeros(1, 5, 2, dtype=torch.float64)
    out = NormalizedPE(2).transform_input(x, torch.arange(5))
    torch.testing.assert_close(out[0, :, 0], torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64), **EXACT)
    out = NormalizedPE(2).transform_input(torch.zeros(1, 1, 2), torch.tensor([0]))
    assert out.tolist() == [[[0.0, 0.0]]]


@pytest.mark.parametrize("method", [IntegerPE(8), NormalizedPE(8), BinaryPE(8, num_bits=4)])
def test_transform_input_rejects_wrong_width(method):
    with pytest.raises(ValueError, match="x has width 6 but this method was built for dim=8"):
        method.transform_input(torch.zeros(2, 3, 6), torch.arange(3))


@pytest.mark.parametrize("method", [IntegerPE(8), NormalizedPE(8), BinaryPE(8, num_bits=4)])
def test_transform_input_rejects_bad_positions(method):
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        method.transform_input(torch.zeros(2, 3, 8), torch.arange(3.0))
    with pytest.raises(ValueError, match="positions must be non-negative"):
        method.transform_input(torch.zeros(2, 3, 8), torch.tensor([0, -1, 1]))


def test_binary_pe_rejects_positions_beyond_max_positions():
    method = BinaryPE(8, num_bits=4)
    assert method.max_positions == 16
    method.transform_input(torch.zeros(1, 16, 8), torch.arange(16))
    message = r"positions has maximum 16, but this method only covers positions 0..15 \(max_positions=16\)"
    with pytest.raises(ValueError, match=message):
        method.transform_input(torch.zeros(1, 17, 8), torch.arange(17))
    with pytest.raises(ValueError, match="only covers positions 0..15"):
        method.check(torch.tensor([20]))


def test_scalar_methods_cover_every_position():
    assert IntegerPE(4).max_positions is None and NormalizedPE(4).max_positions is None
    IntegerPE(4).check(torch.tensor([10**9]))


@pytest.mark.parametrize("cls", [IntegerPE, NormalizedPE, BinaryPE])
@pytest.mark.parametrize("dim", [0, -3, 4.0])
def test_methods_reject_bad_dim(cls, dim):
    with pytest.raises(ValueError, match=rf"dim must be a positive int, got {dim!r}"):
        cls(dim)


@pytest.mark.parametrize("cls", [IntegerPE, NormalizedPE, BinaryPE])
@pytest.mark.parametrize("scale", [0.0, -1.0, True, "1"])
def test_methods_reject_bad_scale(cls, scale):
    with pytest.raises(ValueError, match=rf"scale must be a positive number, got {scale!r}"):
        cls(4, scale=scale)


@pytest.mark.parametrize("cls", [IntegerPE, NormalizedPE])
def test_scalar_methods_reject_unknown_direction_at_construction(cls):
    with pytest.raises(ValueError, match=r"direction must be one of \('alternating', 'ones'\), got 'diagonal'"):
        cls(4, direction="diagonal")


@pytest.mark.parametrize("num_bits", [0, 9])
def test_binary_pe_rejects_bad_num_bits_at_construction(num_bits):
    with pytest.raises(ValueError, match=rf"num_bits must be an int in 1..min\(dim, 62\) = 1..8, got {num_bits}"):
        BinaryPE(8, num_bits=num_bits)


def test_methods_repr_and_no_parameters():
    assert "dim=8, scale=0.5" in repr(IntegerPE(8, scale=0.5))
    assert "dim=8, scale=1, max_positions=16" in repr(BinaryPE(8, num_bits=4))
    for m in (IntegerPE(8), NormalizedPE(8), BinaryPE(8)):
        assert isinstance(m, PositionMethod) and list(m.parameters()) == []
        q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
        assert m.transform_qk(q, k, torch.arange(3), torch.arange(3), 0) == (q, k)  # input-only methods
        assert m.attention_bias(q, k, torch.arange(3), torch.arange(3), 0) is None


# --- registry and model --------------------------------------------------------------------------


@pytest.mark.parametrize("d_model, expected_bits", [(8, 8), (32, 16), (64, 16)])
def test_registry_builds_the_naive_methods(d_model, expected_bits):
    cfg = LMConfig(d_model=d_model, n_head=2, n_layer=1, max_len=16)
    integer, normalized, binary = (build_method(n, cfg) for n in ("integer", "normalized", "binary"))
    assert type(integer) is IntegerPE and integer.dim == d_model and integer.direction == "alternating"
    assert type(normalized) is NormalizedPE and normalized.dim == d_model and normalized.direction == "alternating"
    assert type(binary) is BinaryPE and binary.dim == d_model
    assert binary.num_bits == expected_bits and binary.max_positions == 2**expected_bits
    assert integer.scale == normalized.scale == binary.scale == 1.0


@pytest.mark.parametrize("name", ["integer", "normalized", "binary"])
def test_tiny_lm_runs_with_each_naive_method(device, name):
    cfg = LMConfig(d_model=16, n_head=2, n_layer=1, max_len=16)
    model = TinyLM(cfg, name).to(device)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0)).to(device)
    logits = model(idx)
    assert logits.shape == (2, 16, 256) and torch.isfinite(logits).all()
    assert not torch.allclose(logits, TinyLM(cfg, "nope").to(device)(idx))  # position changes the output
