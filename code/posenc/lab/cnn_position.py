"""How much absolute position a convolutional network can read off a content-free input.

Islam, Jia and Bruce (2020, arXiv:2001.08248) train a small read-out network to predict a
gradient-like map of absolute position from the features of a CNN, and find that the position
information comes from the zero padding at the borders (source 004 §1.3(1)). This module reduces
their experiment to 1-D sequences: a stack of convolutions receives an input that carries no
position, a constant sequence of ones or i.i.d. noise, and must predict at every location ``i`` of
a length-``L`` sequence its normalised position ``t_i = i / (L - 1)``.

Why it can or cannot work. A convolution with circular padding commutes with cyclic shifts
(translation equivariance), and so does every element-wise activation; a stack of them therefore
maps a constant input to an output that is the same at every location, whatever its weights. The
best it can do is predict the mean position, and its mean squared error is then the variance of the
targets, ``Var(t) = (L + 1) / (12 (L - 1))``: no position information at all. Zero padding breaks
the symmetry at the borders, so locations near a border see a different input window than
locations far from it, and position leaks in. The leak is local: an output sees only the input
within its receptive field, ``RF = 1 + layers (kernel_size - 1)`` (:func:`receptive_field`), that
is ``h = (RF - 1) / 2`` locations on either side. Every location at least ``h`` from both ends sees
a window of ones only, at every layer, so all of them get the *same* output even with zero padding
(equivariance still holds in the interior); :func:`constant_input_mse_floor` turns this into a
lower bound on the error. The default network (``RF = 33``) sees a border from every location of a
length-32 sequence, but at ``L = 64`` the 32 middle locations share one output.

Zero padding is not the only leak. Reflect and replicate padding pad a constant sequence with the
same constant, so on the constant input they behave exactly like circular padding; but on noise
they pad the border with copies of the input itself, which changes the statistics of the windows
near a border, and a trained network reads position from that. Only circular padding (or no
border at all) removes position on both inputs.

Why regression with MSE rather than classification into ``L`` classes: the paper's targets are
gradient-like maps (a regression); the targets are ordered, so a prediction one place off should
cost less than one at the other end; and "no information" has a closed form, the variance of the
targets, to which a trained error can be compared directly.

:func:`receptive_field_sweep` trains the probe over a grid of depths and kernel sizes, so the error
can be read against the receptive field: it follows the floor, which vanishes once ``RF >= L``.

The experiment is sized for a laptop CPU: the defaults train in under a second per padding mode on
one thread. Shapes: ``B`` batch, ``L`` sequence length (see the legend in :mod:`posenc`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

#: Padding modes of the probe's convolutions (the ``padding_mode`` of :class:`torch.nn.Conv1d`).
PADDING_MODES = ("zeros", "circular", "reflect", "replicate")
#: Content-free inputs the probe can read (a constant, or noise of fixed statistics).
INPUT_KINDS = ("constant", "noise")


def _check_positive_int(value, name: str, *, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_kernel_size(kernel_size) -> None:
    if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be a positive odd int (for 'same' length output), got {kernel_size!r}")


def _check_padding_mode(padding_mode) -> None:
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")


def receptive_field(layers: int, kernel_size: int) -> int:
    """Number of input locations one output depends on: ``RF = 1 + layers (kernel_size - 1)``.

    Each stride-1 convolution of odd width ``k`` widens the window by ``k - 1`` (``(k - 1) / 2`` on
    each side); the 1x1 read-out of :class:`PositionProbeCNN` adds nothing.

    Args:
        layers: number of ``kernel_size``-wide convolutions, ``>= 1``.
        kernel_size: odd width of each convolution.

    Returns:
        The receptive field, an odd int.

    Raises:
        ValueError: if ``layers < 1`` or ``kernel_size`` is not a positive odd int.
    """
    _check_positive_int(layers, "layers")
    _check_kernel_size(kernel_size)
    return 1 + layers * (kernel_size - 1)


def position_targets(length: int, *, device=None) -> Tensor:
    """The regression targets ``t_i = i / (L - 1)``, evenly spaced on ``[0, 1]``.

    Args:
        length: ``L >= 2``.
        device: device of the result.

    Returns:
        ``(L,)`` float32.

    Raises:
        ValueError: if ``length < 2``.
    """
    _check_positive_int(length, "length", minimum=2)
    return torch.arange(length, dtype=torch.float64, device=device).div(length - 1).float()  # (L,)


def target_variance(length: int) -> float:
    """``Var(t) = (L + 1) / (12 (L - 1))``: the MSE of predicting the mean position everywhere.

    The population variance of ``{0, 1/(L-1), ..., 1}`` (the variance of ``0..L-1`` is
    ``(L² - 1) / 12``, divided by ``(L - 1)²``).

    Raises:
        ValueError: if ``length < 2``.
    """
    _check_positive_int(length, "length", minimum=2)
    return (length + 1) / (12 * (length - 1))


def constant_input_mse_floor(length: int, layers: int, kernel_size: int, padding_mode: str) -> float:
    """The least MSE any :class:`PositionProbeCNN` of this shape can reach on the constant input.

    With circular, reflect or replicate padding every location gets the same output, so the floor
    is :func:`target_variance`. With zero padding the locations ``h <= i <= L - 1 - h``, with
    ``h = (RF - 1) / 2``, get one shared output, and the best shared value is their mean target;
    the others are assumed predicted exactly (the network may or may not manage that), so the floor
    is ``(1 / L) Σ_{i interior} (t_i - mean of interior t)²``, which is 0 when ``L <= 2h + 1``.

    On the noise input the bounds for ``"circular"`` and ``"zeros"`` hold in expectation over the
    noise (the locations concerned see identically distributed windows); reflect and replicate
    padding have no such bound there, since the noise near a border is padded with copies of itself.

    Args:
        length: ``L >= 2``.
        layers, kernel_size: as in :class:`PositionProbeCNN`.
        padding_mode: one of :data:`PADDING_MODES`.

    Returns:
        The floor, a float in ``[0, Var(t)]``.

    Raises:
        ValueError: for a bad ``length``, ``layers``, ``kernel_size`` or ``padding_mode``.
    """
    _check_positive_int(length, "length", minimum=2)
    half = (receptive_field(layers, kernel_size) - 1) // 2
    _check_padding_mode(padding_mode)
    if padding_mode != "zeros":
        return target_variance(length)
    n = length - 2 * half  # interior locations, consecutive, spacing 1 / (L - 1)
    if n <= 1:
        return 0.0
    return n * (n * n - 1) / 12 / (length - 1) ** 2 / length


def probe_inputs(
    kind: str, batch: int, length: int, *, generator: Optional[torch.Generator] = None, device=None
) -> Tensor:
    """Content-free inputs: ``"constant"`` (all ones) or ``"noise"`` (i.i.d. standard normal).

    Neither carries position: the constant is the same everywhere, and noise has the same
    distribution at every location.

    Args:
        kind: ``"constant"`` or ``"noise"``.
        batch: ``B >= 1``.
        length: ``L >= 1``.
        generator: random generator for ``"noise"`` (on the CPU; the noise is moved to ``device``).
        device: device of the result.

    Returns:
        ``(B, 1, L)`` float32.

    Raises:
        ValueError: if ``kind`` is unknown, or ``batch`` or ``length`` is not a positive int.
    """
    if kind not in INPUT_KINDS:
        raise ValueError(f"input_kind must be one of {INPUT_KINDS}, got {kind!r}")
    _check_positive_int(batch, "batch")
    _check_positive_int(length, "length")
    if kind == "constant":
        return torch.ones(batch, 1, length, device=device)
    return torch.randn(batch, 1, length, generator=generator).to(device)  # (B, 1, L)


class PositionProbeCNN(nn.Module):
    """``layers`` convolutions of width ``kernel_size`` with ReLU, then a 1x1 read-out: ``(B, 1, L) -> (B, L)``.

    Every convolution pads ``(kernel_size - 1) / 2`` locations on each side with ``padding_mode``,
    so the length is kept ("same" convolution) and the network is as translation-equivariant as its
    padding lets it be:

    * ``"zeros"``: equivariant only away from the borders; the zeros are a border signal;
    * ``"circular"``: exactly equivariant to cyclic shifts, everywhere;
    * ``"reflect"``, ``"replicate"``: not equivariant in general (the padded values copy the input
      near the border), but a constant input is padded with the same constant, so on it they act
      like ``"circular"``.

    Args:
        channels: hidden channels.
        layers: number of ``kernel_size``-wide convolutions.
        kernel_size: odd width of each convolution.
        padding_mode: one of :data:`PADDING_MODES`.
        seed: if given, the weights are initialised from ``torch.manual_seed(seed)`` without
            touching the global random state (PyTorch's default ``Conv1d`` initialisation).
    """

    def __init__(
        self,
        channels: int = 16,
        layers: int = 4,
        kernel_size: int = 9,
        padding_mode: str = "zeros",
        *,
        seed: Optional[int] = None,
    ):
        super().__init__()
        _check_positive_int(channels, "channels")
        self.receptive_field = receptive_field(layers, kernel_size)  # validates layers, kernel_size
        _check_padding_mode(padding_mode)
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self.channels, self.layers, self.kernel_size, self.padding_mode = channels, layers, kernel_size, padding_mode
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            pad = kernel_size // 2
            self.convs = nn.ModuleList(
                nn.Conv1d(1 if i == 0 else channels, channels, kernel_size, padding=pad, padding_mode=padding_mode)
                for i in range(layers)
            )
            self.readout = nn.Conv1d(channels, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        """Predicted normalised position at every location.

        Args:
            x: ``(B, 1, L)`` floating input.

        Returns:
            ``(B, L)``.

        Raises:
            TypeError: if ``x`` is not a floating-point tensor.
            ValueError: if ``x`` is not ``(B, 1, L)``, or ``L`` is too short for reflect padding.
        """
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"x must be a floating-point tensor, got {got}")
        if x.dim() != 3 or x.shape[1] != 1:
            raise ValueError(f"x must be (B, 1, L), got shape {tuple(x.shape)}")
        pad = self.kernel_size // 2
        if self.padding_mode == "reflect" and x.shape[2] <= pad:
            raise ValueError(f"reflect padding needs L > (kernel_size - 1) / 2 = {pad}, got L = {x.shape[2]}")
        for conv in self.convs:
            x = torch.relu(conv(x))  # (B, channels, L)
        return self.readout(x)[:, 0]  # (B, L)

    def extra_repr(self) -> str:
        return f"receptive_field={self.receptive_field}"


@dataclass
class ProbeResult:
    """What :func:`train_position_probe` measured."""

    losses: list[float]  #: training MSE at every step, before the update
    mse: float  #: evaluation MSE, over locations (and noise samples)
    within_one: float  #: fraction of locations predicted within ±1 place of the truth
    target_variance: float  #: Var(t), the least MSE of a network that knows no position
    prediction: Tensor  #: mean prediction per location, (L,) float64 on the CPU


def train_position_probe(
    model: PositionProbeCNN,
    length: int,
    steps: int,
    *,
    input_kind: str = "constant",
    batch_size: int = 8,
    eval_batch: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
) -> ProbeResult:
    """Train ``model`` in place with Adam to predict ``t_i = i / (L - 1)``; evaluate it.

    Runs on the device and in the dtype of the model's parameters. The constant input is the same every step (one
    sample; ``batch_size`` and ``eval_batch`` are ignored); the noise input is drawn afresh every
    step from a generator seeded with ``seed``, and evaluated on ``eval_batch`` new draws. Given the
    model's initial weights (see ``PositionProbeCNN(seed=...)``) and ``seed``, the result is
    deterministic on the CPU.

    Args:
        model: the network to train (modified).
        length: sequence length ``L >= 2``.
        steps: optimisation steps, ``>= 0``.
        input_kind: ``"constant"`` or ``"noise"``.
        batch_size: noise samples per step.
        eval_batch: noise samples for the evaluation.
        lr: Adam learning rate.
        seed: seed of the noise.

    Returns:
        A :class:`ProbeResult`.

    Raises:
        TypeError: if ``model`` is not a :class:`PositionProbeCNN`.
        ValueError: for a bad ``length``, ``steps``, ``input_kind``, ``batch_size``, ``eval_batch``
            or ``lr``.
    """
    if not isinstance(model, PositionProbeCNN):
        raise TypeError(f"model must be a PositionProbeCNN, got {type(model).__name__}")
    _check_positive_int(length, "length", minimum=2)
    _check_positive_int(steps, "steps", minimum=0)
    if input_kind not in INPUT_KINDS:
        raise ValueError(f"input_kind must be one of {INPUT_KINDS}, got {input_kind!r}")
    _check_positive_int(batch_size, "batch_size")
    _check_positive_int(eval_batch, "eval_batch")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    generator = torch.Generator().manual_seed(seed)
    target = position_targets(length, device=device).to(dtype)  # (L,)
    train_batch, test_batch = (1, 1) if input_kind == "constant" else (batch_size, eval_batch)

    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(steps):
        x = probe_inputs(input_kind, train_batch, length, generator=generator, device=device).to(dtype)  # (B, 1, L)
        loss = (model(x) - target).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())  # no host sync inside the loop

    model.eval()
    with torch.no_grad():
        x = probe_inputs(input_kind, test_batch, length, generator=generator, device=device).to(dtype)
        pred = model(x).double()  # (B, L)
    err = pred - target.double()
    return ProbeResult(
        losses=torch.stack(losses).tolist() if losses else [],
        mse=err.pow(2).mean().item(),
        within_one=(err.abs() * (length - 1) <= 1).double().mean().item(),
        target_variance=target_variance(length),
        prediction=pred.mean(0).cpu(),
    )


@dataclass
class SweepResult:
    """What :func:`receptive_field_sweep` measured: ``Nl`` depths x ``Nk`` kernel sizes x ``S`` seeds."""

    layers: tuple[int, ...]  #: the depths, ``Nl`` of them
    kernel_sizes: tuple[int, ...]  #: the kernel sizes, ``Nk`` of them
    seeds: tuple[int, ...]  #: the seeds, ``S`` of them
    receptive_field: Tensor  #: (Nl, Nk) int64, :func:`receptive_field`
    floor: Tensor  #: (Nl, Nk) float64, :func:`constant_input_mse_floor` / Var(t)
    error: Tensor  #: (Nl, Nk, S) float64, evaluation MSE / Var(t)
    within_one: Tensor  #: (Nl, Nk, S) float64, fraction of locations within ±1 place
    prediction: Tensor  #: (Nl, Nk, S, L) float64, mean prediction per location


def _check_int_sequence(values, name: str, *, odd: bool = False, minimum: Optional[int] = 1) -> tuple[int, ...]:
    what = "positive odd ints" if odd else "ints" if minimum is None else f"ints >= {minimum}"
    ok = isinstance(values, Sequence) and not isinstance(values, str) and len(values) > 0
    ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    ok = ok and (minimum is None or all(v >= minimum for v in values)) and (not odd or all(v % 2 for v in values))
    if not ok:
        raise ValueError(f"{name} must be a non-empty sequence of {what}, got {values!r}")
    return tuple(values)


def receptive_field_sweep(
    length: int,
    layers: Sequence[int],
    kernel_sizes: Sequence[int],
    *,
    seeds: Sequence[int] = (0, 1, 2),
    steps: int = 300,
    padding_mode: str = "zeros",
    input_kind: str = "constant",
    channels: int = 16,
    lr: float = 3e-3,
) -> SweepResult:
    """Train the probe at every depth x kernel size x seed, and score it against the receptive field.

    Each run is ``train_position_probe(PositionProbeCNN(channels, l, k, padding_mode, seed=s), length,
    steps, input_kind=input_kind, lr=lr, seed=s)``: the seed fixes the initial weights and the noise,
    so a run equals the same run made by hand, and the sweep is deterministic on the CPU. Errors are
    given as a fraction of ``Var(t)`` (1: no position; 0: exact), beside the floor that the
    receptive field ``RF = 1 + l (k - 1)`` puts under them (:func:`constant_input_mse_floor`, also
    over ``Var(t)``; zero once ``RF >= length``).

    Args:
        length: sequence length ``L >= 2``.
        layers: the depths to try, ``Nl`` ints ``>= 1``.
        kernel_sizes: the kernel sizes to try, ``Nk`` positive odd ints.
        seeds: ``S`` seeds, each one run per configuration.
        steps: Adam steps per run, ``>= 0``.
        padding_mode: one of :data:`PADDING_MODES`.
        input_kind: one of :data:`INPUT_KINDS`.
        channels: hidden channels of every network.
        lr: Adam learning rate.

    Returns:
        A :class:`SweepResult`: ``receptive_field`` and ``floor`` ``(Nl, Nk)``; ``error`` and
        ``within_one`` ``(Nl, Nk, S)``; ``prediction`` ``(Nl, Nk, S, L)``.

    Raises:
        ValueError: for a bad ``length``, ``layers``, ``kernel_sizes``, ``seeds``, ``steps``,
            ``padding_mode``, ``input_kind``, ``channels`` or ``lr``.
    """
    _check_positive_int(length, "length", minimum=2)
    layers = _check_int_sequence(layers, "layers")
    kernel_sizes = _check_int_sequence(kernel_sizes, "kernel_sizes", odd=True)
    seeds = _check_int_sequence(seeds, "seeds", minimum=None)
    _check_positive_int(steps, "steps", minimum=0)
    _check_padding_mode(padding_mode)
    if input_kind not in INPUT_KINDS:
        raise ValueError(f"input_kind must be one of {INPUT_KINDS}, got {input_kind!r}")
    _check_positive_int(channels, "channels")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")

    shape = (len(layers), len(kernel_sizes))
    rf = torch.tensor([[receptive_field(n, k) for k in kernel_sizes] for n in layers])  # (Nl, Nk)
    var = target_variance(length)
    floor = torch.tensor([[constant_input_mse_floor(length, n, k, padding_mode) / var for k in kernel_sizes]
                          for n in layers], dtype=torch.float64)  # (Nl, Nk)
    error = torch.empty(*shape, len(seeds), dtype=torch.float64)  # (Nl, Nk, S)
    within_one = torch.empty_like(error)
    prediction = torch.empty(*shape, len(seeds), length, dtype=torch.float64)  # (Nl, Nk, S, L)
    for a, n in enumerate(layers):
        for b, k in enumerate(kernel_sizes):
            for c, s in enumerate(seeds):
                model = PositionProbeCNN(channels, n, k, padding_mode, seed=s)
                run = train_position_probe(model, length, steps, input_kind=input_kind, lr=lr, seed=s)
                error[a, b, c], within_one[a, b, c] = run.mse / var, run.within_one
                prediction[a, b, c] = run.prediction
    return SweepResult(layers, kernel_sizes, seeds, rf, floor, error, within_one, prediction)
