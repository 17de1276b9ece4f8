"""Tests of posenc.lab.cnn_position: how much absolute position a 1-D CNN reads off a content-free input."""

import pytest
import torch

from posenc.lab.cnn_position import (
    PositionProbeCNN,
    constant_input_mse_floor,
    position_targets,
    probe_inputs,
    receptive_field,
    receptive_field_sweep,
    target_variance,
    train_position_probe,
)


def _half(layers, kernel_size):
    return (receptive_field(layers, kernel_size) - 1) // 2


# --- receptive field -----------------------------------------------------------------------------


def test_receptive_field_frozen_values():
    assert receptive_field(1, 1) == 1
    assert receptive_field(1, 3) == 3
    assert receptive_field(3, 3) == 7
    assert receptive_field(4, 9) == 33
    assert PositionProbeCNN(layers=2, kernel_size=5).receptive_field == 9


@pytest.mark.parametrize("layers,kernel_size", [(1, 3), (2, 5), (3, 3), (4, 7)])
def test_receptive_field_matches_the_support_of_the_input_gradient(device, layers, kernel_size):
    model = PositionProbeCNN(8, layers, kernel_size, seed=0).double().to(device)
    length, half = 48, _half(layers, kernel_size)
    x = torch.randn(1, 1, length, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    for i in (0, 3, 24, length - 1):
        x.grad = None
        x.requires_grad_(True)
        model(x)[0, i].backward()
        support = x.grad[0, 0].nonzero().flatten().tolist()
        assert support == list(range(max(0, i - half), min(length, i + half + 1))), (i, support)


# --- untrained networks: exact properties --------------------------------------------------------


@pytest.mark.parametrize("padding_mode", ["circular", "reflect", "replicate"])
@pytest.mark.parametrize("seed", [0, 1])
def test_constant_input_gives_the_same_output_everywhere_without_zero_padding(device, padding_mode, seed):
    model = PositionProbeCNN(12, 3, 7, padding_mode, seed=seed).to(device)
    out = model(torch.ones(2, 1, 40, device=device))  # (B, L)
    torch.testing.assert_close(out, out[:, :1].expand_as(out), atol=1e-6, rtol=0)


def test_circular_padding_is_equivariant_to_cyclic_shifts(device):
    model = PositionProbeCNN(8, 3, 5, "circular", seed=0).double().to(device)
    x = torch.randn(3, 1, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)
    for shift in (1, 7, -4):
        torch.testing.assert_close(model(x.roll(shift, dims=2)), model(x).roll(shift, dims=1), atol=1e-12, rtol=0)


def test_zero_padding_gives_identical_outputs_in_the_interior(device):
    """Locations at least h = (RF - 1) / 2 from both ends see only ones, at every layer."""
    layers, k, length = 3, 5, 64
    half = _half(layers, k)  # 6
    model = PositionProbeCNN(12, layers, k, "zeros", seed=0).to(device)
    out = model(torch.ones(1, 1, length, device=device))[0]  # (L,)
    interior = out[half : length - half]
    torch.testing.assert_close(interior, interior[:1].expand_as(interior), atol=1e-6, rtol=0)
    # not vacuous: the locations nearer a border than h all differ from the interior value
    border = torch.cat([out[:half], out[length - half :]])
    assert ((border - interior[0]).abs() > 1e-5).all()


def test_zero_padding_is_not_equivariant_on_noise():
    model = PositionProbeCNN(8, 3, 5, "zeros", seed=0).double()
    x = torch.randn(1, 1, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert (model(x.roll(5, dims=2)) - model(x).roll(5, dims=1)).abs().max() > 1e-3


# --- targets and floors --------------------------------------------------------------------------


def test_targets_and_their_variance_frozen_values():
    torch.testing.assert_close(position_targets(5), torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]))
    assert target_variance(64) == pytest.approx(65 / 756)
    for length in (2, 5, 64):
        assert target_variance(length) == pytest.approx(position_targets(length).double().var(unbiased=False).item())


def test_mse_floor_is_the_variance_of_the_interior_targets():
    """Independent formulation: predict the interior's mean there, every other location exactly."""
    for length, layers, k in [(64, 4, 9), (64, 3, 5), (20, 1, 3), (32, 4, 9), (10, 5, 9)]:
        t = torch.arange(length, dtype=torch.float64) / (length - 1)
        half = _half(layers, k)
        band = t[half : length - half]
        expected = (band - band.mean()).pow(2).sum().item() / length if band.numel() else 0.0
        assert constant_input_mse_floor(length, layers, k, "zeros") == pytest.approx(expected, abs=1e-15)
    assert constant_input_mse_floor(64, 4, 9, "zeros") / target_variance(64) == pytest.approx(0.125, abs=1e-3)
    assert constant_input_mse_floor(32, 4, 9, "zeros") == 0.0  # RF = 33 >= L: every location sees a border
    for mode in ("circular", "reflect", "replicate"):
        assert constant_input_mse_floor(64, 4, 9, mode) == target_variance(64)


# --- training ------------------------------------------------------------------------------------


def test_zero_padding_learns_position_from_a_constant_input():
    model = PositionProbeCNN(seed=0)  # RF = 33 covers L = 32 from every location
    result = train_position_probe(model, 32, 200, lr=1e-2, seed=0)
    assert result.mse <= 0.2 * result.target_variance
    assert result.within_one >= 0.8
    assert result.losses[-1] < 0.2 * result.losses[0]


def test_circular_padding_cannot_beat_predicting_the_mean_position():
    model = PositionProbeCNN(padding_mode="circular", seed=0)
    result = train_position_probe(model, 32, 200, lr=1e-2, seed=0)
    assert result.mse >= 0.95 * result.target_variance
    assert result.prediction.std() < 1e-5  # one value for every location


def test_circular_padding_learns_nothing_from_noise_either():
    model = PositionProbeCNN(padding_mode="circular", seed=0)
    result = train_position_probe(model, 32, 100, input_kind="noise", lr=1e-2, seed=0)
    assert result.mse >= 0.9 * result.target_variance


def test_training_never_beats_the_interior_floor_when_the_receptive_field_is_short():
    model = PositionProbeCNN(seed=0)  # RF = 33 < L = 64: 32 interior locations share one output
    result = train_position_probe(model, 64, 150, lr=1e-2, seed=0)
    floor = constant_input_mse_floor(64, 4, 9, "zeros")
    assert floor <= result.mse <= 0.5 * result.target_variance
    interior = result.prediction[16:48]
    assert (interior - interior[0]).abs().max() < 1e-5


def test_reflect_padding_leaks_position_on_noise():
    """Reflect padding acts like circular on a constant, but not on noise: the border copies itself."""
    model = PositionProbeCNN(padding_mode="reflect", seed=0)
    result = train_position_probe(model, 32, 150, input_kind="noise", seed=0)
    assert result.mse <= 0.6 * result.target_variance


def test_training_is_deterministic_given_the_seeds():
    runs = [
        train_position_probe(PositionProbeCNN(8, 2, 5, seed=3), 16, 20, input_kind="noise", seed=5) for _ in range(2)
    ]
    assert runs[0].losses == runs[1].losses and runs[0].mse == runs[1].mse
    other = train_position_probe(PositionProbeCNN(8, 2, 5, seed=3), 16, 20, input_kind="noise", seed=6)
    assert other.losses != runs[0].losses


def test_training_runs_on_the_model_device(device):
    model = PositionProbeCNN(8, 2, 5, seed=0).to(device)
    result = train_position_probe(model, 16, 5, seed=0)
    assert len(result.losses) == 5 and result.prediction.shape == (16,) and result.prediction.device.type == "cpu"
    assert next(model.parameters()).device.type == device.type
    double = train_position_probe(PositionProbeCNN(8, 2, 5, seed=0).double().to(device), 16, 3, input_kind="noise")
    assert len(double.losses) == 3 and double.prediction.dtype == torch.float64


def test_probe_inputs_and_forward_shapes(device):
    ones = probe_inputs("constant", 3, 10, device=device)
    assert ones.shape == (3, 1, 10) and (ones == 1).all() and ones.device.type == device.type
    noise = probe_inputs("noise", 4000, 10, generator=torch.Generator().manual_seed(0))
    assert abs(noise.mean().item()) < 0.02 and abs(noise.std().item() - 1) < 0.02
    assert torch.equal(noise, probe_inputs("noise", 4000, 10, generator=torch.Generator().manual_seed(0)))
    model = PositionProbeCNN(4, 2, 3, seed=0).to(device)
    assert model(ones).shape == (3, 10)


def test_seed_does_not_touch_the_global_random_state():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    PositionProbeCNN(seed=0)
    assert torch.equal(torch.rand(3), expected)
    a, b = PositionProbeCNN(seed=4), PositionProbeCNN(seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


# --- depth x kernel sweep ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_sweep():
    """L = 16; receptive fields 3, 9 (1 layer) and 5, 17 (2 layers): only the last covers the sequence."""
    return receptive_field_sweep(16, (1, 2), (3, 9), seeds=(0, 1), steps=150, lr=1e-2)


def test_sweep_shapes_receptive_fields_and_floors(small_sweep):
    r = small_sweep
    assert (r.layers, r.kernel_sizes, r.seeds) == ((1, 2), (3, 9), (0, 1))
    assert torch.equal(r.receptive_field, torch.tensor([[3, 9], [5, 17]]))
    assert r.floor.shape == (2, 2) and r.error.shape == r.within_one.shape == (2, 2, 2)
    assert r.prediction.shape == (2, 2, 2, 16) and r.error.dtype == torch.float64
    for a, n in enumerate(r.layers):
        for b, k in enumerate(r.kernel_sizes):
            expected = constant_input_mse_floor(16, n, k, "zeros") / target_variance(16)
            assert r.floor[a, b].item() == pytest.approx(expected)
    assert r.floor[1, 1] == 0.0 and (r.floor[r.receptive_field < 16] > 0.1).all()


def test_sweep_error_follows_the_floor_and_vanishes_once_the_receptive_field_covers_the_sequence(small_sweep):
    r = small_sweep
    assert (r.error >= r.floor[..., None] - 1e-6).all()  # the floor bounds every network (mathematics)
    assert (r.error <= r.floor[..., None] + 0.05).all()  # and training reaches it (a finding of training)
    assert r.error[1, 1].max() < 0.02  # RF = 17 >= L = 16: position recovered almost exactly


def test_sweep_runs_equal_the_same_runs_made_by_hand(small_sweep):
    run = train_position_probe(PositionProbeCNN(16, 2, 9, "zeros", seed=1), 16, 150, lr=1e-2, seed=1)
    assert small_sweep.error[1, 1, 1].item() == run.mse / run.target_variance
    assert small_sweep.within_one[1, 1, 1].item() == run.within_one
    assert torch.equal(small_sweep.prediction[1, 1, 1], run.prediction)


def test_sweep_with_circular_padding_never_beats_the_variance():
    r = receptive_field_sweep(12, (1, 3), (5,), seeds=(0,), steps=20, padding_mode="circular")
    assert (r.floor == 1).all() and (r.error >= 1 - 1e-6).all()


# --- bad inputs (one test per rule) --------------------------------------------------------------


def test_rejects_zero_layers():
    with pytest.raises(ValueError, match="layers must be an int >= 1, got 0"):
        receptive_field(0, 3)


@pytest.mark.parametrize("kernel_size", [4, 0, 3.0])
def test_rejects_a_kernel_size_that_is_not_a_positive_odd_int(kernel_size):
    with pytest.raises(ValueError, match=r"kernel_size must be a positive odd int \(for 'same' length output\), got"):
        PositionProbeCNN(kernel_size=kernel_size)


def test_rejects_an_unknown_padding_mode():
    message = r"padding_mode must be one of \('zeros', 'circular', 'reflect', 'replicate'\), got 'valid'"
    with pytest.raises(ValueError, match=message):
        PositionProbeCNN(padding_mode="valid")


def test_rejects_zero_channels():
    with pytest.raises(ValueError, match="channels must be an int >= 1, got 0"):
        PositionProbeCNN(channels=0)


def test_rejects_a_non_int_seed():
    with pytest.raises(TypeError, match="seed must be an int or None, got float"):
        PositionProbeCNN(seed=1.0)


def test_forward_rejects_an_integer_input():
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got torch.int64"):
        PositionProbeCNN()(torch.ones(1, 1, 8, dtype=torch.long))


def test_forward_rejects_an_input_without_a_channel_axis():
    with pytest.raises(ValueError, match=r"x must be \(B, 1, L\), got shape \(2, 8\)"):
        PositionProbeCNN()(torch.ones(2, 8))


def test_forward_rejects_a_sequence_too_short_for_reflect_padding():
    with pytest.raises(ValueError, match=r"reflect padding needs L > \(kernel_size - 1\) / 2 = 4, got L = 4"):
        PositionProbeCNN(padding_mode="reflect")(torch.ones(1, 1, 4))


def test_rejects_a_length_below_two():
    with pytest.raises(ValueError, match="length must be an int >= 2, got 1"):
        position_targets(1)


def test_train_rejects_negative_steps():
    with pytest.raises(ValueError, match="steps must be an int >= 0, got -1"):
        train_position_probe(PositionProbeCNN(), 16, -1)


def test_train_rejects_an_unknown_input_kind():
    with pytest.raises(ValueError, match=r"input_kind must be one of \('constant', 'noise'\), got 'ramp'"):
        train_position_probe(PositionProbeCNN(), 16, 1, input_kind="ramp")


def test_train_rejects_a_zero_batch_size():
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        train_position_probe(PositionProbeCNN(), 16, 1, batch_size=0)


def test_train_rejects_a_non_positive_learning_rate():
    with pytest.raises(ValueError, match="lr must be a positive number, got 0.0"):
        train_position_probe(PositionProbeCNN(), 16, 1, lr=0.0)


def test_train_rejects_another_model():
    with pytest.raises(TypeError, match="model must be a PositionProbeCNN, got Conv1d"):
        train_position_probe(torch.nn.Conv1d(1, 1, 3), 16, 1)


def test_probe_inputs_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match=r"input_kind must be one of \('constant', 'noise'\), got 'zeros'"):
        probe_inputs("zeros", 1, 8)


@pytest.mark.parametrize("layers", [(), (0, 2), (2.0,), 3])
def test_sweep_rejects_layers_that_are_not_a_non_empty_sequence_of_positive_ints(layers):
    with pytest.raises(ValueError, match=r"layers must be a non-empty sequence of ints >= 1, got"):
        receptive_field_sweep(16, layers, (3,))


@pytest.mark.parametrize("kernel_sizes", [(), (3, 4), (-1,)])
def test_sweep_rejects_kernel_sizes_that_are_not_positive_odd_ints(kernel_sizes):
    with pytest.raises(ValueError, match=r"kernel_sizes must be a non-empty sequence of positive odd ints, got"):
        receptive_field_sweep(16, (1,), kernel_sizes)


@pytest.mark.parametrize("seeds", [(), (0.5,), "01"])
def test_sweep_rejects_seeds_that_are_not_a_non_empty_sequence_of_ints(seeds):
    with pytest.raises(ValueError, match=r"seeds must be a non-empty sequence of ints, got"):
        receptive_field_sweep(16, (1,), (3,), seeds=seeds)


def test_sweep_rejects_a_length_below_two():
    with pytest.raises(ValueError, match="length must be an int >= 2, got 1"):
        receptive_field_sweep(1, (1,), (3,))


def test_sweep_rejects_negative_steps():
    with pytest.raises(ValueError, match="steps must be an int >= 0, got -1"):
        receptive_field_sweep(16, (1,), (3,), steps=-1)


def test_sweep_rejects_an_unknown_padding_mode():
    with pytest.raises(ValueError, match=r"padding_mode must be one of .*, got 'valid'"):
        receptive_field_sweep(16, (1,), (3,), padding_mode="valid")


def test_sweep_rejects_an_unknown_input_kind():
    with pytest.raises(ValueError, match=r"input_kind must be one of \('constant', 'noise'\), got 'ramp'"):
        receptive_field_sweep(16, (1,), (3,), input_kind="ramp")


def test_sweep_rejects_zero_channels():
    with pytest.raises(ValueError, match="channels must be an int >= 1, got 0"):
        receptive_field_sweep(16, (1,), (3,), channels=0)


def test_sweep_rejects_a_non_positive_learning_rate():
    with pytest.raises(ValueError, match="lr must be a positive number, got -1"):
        receptive_field_sweep(16, (1,), (3,), lr=-1)
