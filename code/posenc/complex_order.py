"""Complex-order word embeddings: every word is a complex wave over positions (Wang et al. 2020).

Wang, Zhao, Lioma, Li, Zhang and Simonsen (2020, "Encoding word order in complex embeddings",
arXiv:1912.12333, ICLR 2020; source 004 §1.3(2)) replace "word embedding plus
position embedding" by one function of the word ``w`` and its position ``p``. From two
requirements, their Property 1 (position-free offset transformation: the embedding at ``p + k`` is
obtained from the one at ``p`` by a transformation that depends on ``k`` only) and Property 2
(boundedness at every position), they derive the general complex solution

    f(w, p) = r_w ⊙ exp(i (ω_w p + θ_w))              one complex number per dimension c < C,

with three real ``C``-vectors per word: amplitude ``r_w``, angular frequency ``ω_w`` and initial
phase ``θ_w``. Each dimension is a point turning on a circle of radius ``|r_{w,c}|`` at speed
``ω_{w,c}``; the word decides both what it means (amplitude) and how fast its meaning turns with
position (frequency).

The relative property. ``f(w, p + k) = exp(i ω_w k) ⊙ f(w, p)``: moving a word by ``k`` multiplies
it by a diagonal unitary matrix (:func:`shift_operator`) that depends on ``k`` and the word's
frequencies, not on ``p``. The Hermitian inner product (:func:`complex_inner_product`, conjugate on
the first argument) of word ``u`` at position ``p`` with word ``v`` at position ``q`` is

    <f(u, p), f(v, q)> = Σ_c r_{u,c} r_{v,c} exp(i (ω_{v,c} q - ω_{u,c} p + θ_{v,c} - θ_{u,c}))
                       = Σ_c r_{u,c} r_{v,c} exp(i (ω_c (q - p) + θ_{v,c} - θ_{u,c}))   if ω_u = ω_v = ω,

so for words that share their frequencies it depends on the positions only through the relative
position ``q - p`` (key position minus query position, with ``u`` the query, as everywhere in
``posenc``). Words with different frequencies do not have this property: ``ω_v q - ω_u p =
ω_v (q - p) + (ω_v - ω_u) p`` also depends on ``p``. RoPE (Su et al. 2021, arXiv:2104.09864) is the
shared-frequency case moved into attention: it multiplies every query and key, seen as ``D/2``
complex numbers, by ``exp(i ω p)`` with fixed frequencies ``ω_i = base^{-2i/D}`` shared by all
tokens, so the real part of the query-key product depends on ``q - p`` only. A complex-order
embedding whose frequencies are shared by all words applies the same kind of rotation once, to
the embeddings, with a word-dependent starting phase ``θ_w``.

What the authors' PyTorch Transformers do (``iclr-complex-order/complex-order``): the amplitude is an
``nn.Embedding`` (``N(0, 1)`` entries); the frequency table starts at the Transformer's
frequencies ``10000^{-2⌊c/2⌋/C}`` for every word (trainable for classification, frozen for
translation); the initial phase is left out (``θ = 0``). :class:`ComplexOrderEmbedding` offers
those choices and the ones suggested by the formula (see its docstring).

Angles are computed in float32, or float64 if any parameter is float64, whatever the parameters'
dtype; the result is complex64 (complex128 for float64). Shape legend in :mod:`posenc`; here ``B``
batch, ``T`` sequence length, ``C`` complex dimensions, ``V`` vocabulary size.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from posenc.method import check_positions

FREQUENCY_INITS = ("sinusoidal", "transformer", "uniform")
PHASE_INITS = ("uniform", "zeros")


def _work_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any tensor is float64, else float32 (angles are never computed in 16 bits)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_float(x, name: str) -> None:
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a floating-point tensor, got {got}")


def _check_positive_int(value, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def complex_order_embedding(amplitude: Tensor, frequency: Tensor, phase: Tensor, positions: Tensor) -> Tensor:
    """``f = r ⊙ exp(i (ω p + θ))`` per token, from its gathered parameters (Wang et al. 2020, arXiv:1912.12333).

    Each token's ``(r, ω, θ)`` are rows already gathered from the word tables (as
    :class:`ComplexOrderEmbedding` does), so words repeated in a sequence simply repeat rows.
    Computed as ``r cos(ω p + θ) + i r sin(ω p + θ)``; a negative amplitude is allowed (it is the
    same as a phase shifted by ``π``), so ``|f| = |r|`` element-wise.

    Args:
        amplitude: ``(..., T, C)`` floating, ``r``.
        frequency: ``(..., T, C)`` floating, ``ω`` (radians per position), same shape.
        phase: ``(..., T, C)`` floating, ``θ`` (radians), same shape.
        positions: ``(T,)`` integer positions ``p`` of the ``T`` tokens.

    Returns:
        ``(..., T, C)`` complex64, or complex128 if any parameter is float64, on the parameters' device.

    Raises:
        TypeError: if a parameter is not a floating-point tensor or ``positions`` is not an integer tensor.
        ValueError: if the parameters differ in shape or are not at least 2-D, ``positions`` is not
            1-D, non-negative and of length ``T``.
    """
    for x, name in ((amplitude, "amplitude"), (frequency, "frequency"), (phase, "phase")):
        _check_float(x, name)
    if not amplitude.shape == frequency.shape == phase.shape:
        raise ValueError(
            "amplitude, frequency and phase must have the same shape, got "
            f"{tuple(amplitude.shape)}, {tuple(frequency.shape)} and {tuple(phase.shape)}"
        )
    if amplitude.dim() < 2:
        raise ValueError(f"amplitude, frequency and phase must be (..., T, C), got shape {tuple(amplitude.shape)}")
    check_positions(positions)
    if positions.shape[0] != amplitude.shape[-2]:
        raise ValueError(
            f"positions has {positions.shape[0]} entries but the parameters have T = {amplitude.shape[-2]} "
            f"(shape {tuple(amplitude.shape)})"
        )
    work = _work_dtype(amplitude, frequency, phase)
    p = positions.to(device=frequency.device, dtype=work)[:, None]  # (T, 1)
    angle = frequency.to(work) * p + phase.to(work)  # (..., T, C)
    r = amplitude.to(work)
    return torch.complex(r * torch.cos(angle), r * torch.sin(angle))  # (..., T, C) complex


def shift_operator(frequency: Tensor, k: int) -> Tensor:
    """The diagonal of the map moving an embedding by ``k`` positions: ``exp(i ω k)``.

    For every word and every position ``p``, ``f(w, p + k) = shift_operator(ω_w, k) * f(w, p)``
    (element-wise): the position-free offset transformation of Wang et al. (2020, arXiv:1912.12333,
    Property 1). The map is linear, diagonal and unitary (every entry has modulus 1), depends on
    ``k`` and the word's frequencies but not on ``p``; shifts compose, ``S(k1) S(k2) = S(k1 + k2)``.

    Args:
        frequency: ``(..., C)`` floating, the frequencies ``ω`` of one or more words.
        k: shift in positions (any int, negative included).

    Returns:
        ``(..., C)`` complex64 (complex128 for float64 ``frequency``).

    Raises:
        TypeError: if ``frequency`` is not a floating-point tensor or ``k`` is not an int.
    """
    _check_float(frequency, "frequency")
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    angle = frequency.to(_work_dtype(frequency)) * k  # (..., C)
    return torch.complex(torch.cos(angle), torch.sin(angle))


def complex_inner_product(a: Tensor, b: Tensor) -> Tensor:
    """Hermitian inner product over the last dimension, conjugating the first argument: ``Σ_c conj(a_c) b_c``.

    The convention of ``torch.vdot`` and of physics: ``<a, b> = conj(<b, a>)`` and ``<a, a> = ‖a‖²``.
    With ``a = f(u, p)`` (query word ``u`` at ``p``) and ``b = f(v, q)``, the phase of each term is
    ``ω_v q - ω_u p + θ_v - θ_u``; see the module docstring for when this depends on ``q - p`` only.

    Args:
        a: ``(..., C)`` complex.
        b: ``(..., C)`` complex, broadcastable with ``a``.

    Returns:
        ``(...)`` complex.

    Raises:
        TypeError: if ``a`` or ``b`` is not a complex tensor.
    """
    for x, name in ((a, "a"), (b, "b")):
        if not isinstance(x, Tensor) or not x.dtype.is_complex:
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"{name} must be a complex tensor, got {got}")
    return (a.conj() * b).sum(-1)  # (...)


def to_real(z: Tensor) -> Tensor:
    """Real and imaginary parts side by side, ``[Re z | Im z]``, to feed a real-valued model.

    For ``z = f(w, p)`` this is ``[r cos(ω p + θ) | r sin(ω p + θ)]``, a real code of width ``2C``;
    the Euclidean dot product of two such codes is the real part of :func:`complex_inner_product`.

    Args:
        z: ``(..., C)`` complex.

    Returns:
        ``(..., 2C)`` real (float32 for complex64, float64 for complex128).

    Raises:
        TypeError: if ``z`` is not a complex tensor.
    """
    if not isinstance(z, Tensor) or not z.dtype.is_complex:
        got = z.dtype if isinstance(z, Tensor) else type(z).__name__
        raise TypeError(f"z must be a complex tensor, got {got}")
    return torch.cat([z.real, z.imag], dim=-1)  # (..., 2C)


def initial_frequencies(dim: int, init: str = "sinusoidal", base: float = 10000.0) -> Tensor:
    """A ``(C,)`` frequency vector that every word starts from (the deterministic initialisations).

    * ``"sinusoidal"``: ``ω_c = base^{-c/C}``, one frequency per complex dimension; these are the
      frequencies of a sinusoidal table of width ``2C`` (:func:`posenc.absolute.inverse_frequencies`),
      so with ``r = 1`` and ``θ = 0``, :func:`to_real` of the embedding is that table in the
      layout ``[cos | sin]``;
    * ``"transformer"``: ``ω_c = base^{-2⌊c/2⌋/C}``, the authors' code: the Transformer's ``C/2``
      frequencies, each used by two consecutive dimensions.

    Returns:
        ``(C,)`` float64 on the CPU, non-increasing, in ``(0, 1]``.

    Raises:
        ValueError: if ``dim`` is not a positive int, ``init`` is not one of the two above, or ``base <= 1``.
    """
    _check_positive_int(dim, "dim")
    if init not in ("sinusoidal", "transformer"):
        raise ValueError(f"init must be 'sinusoidal' or 'transformer' here, got {init!r}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    c = torch.arange(dim, dtype=torch.float64)
    exponent = c / dim if init == "sinusoidal" else 2 * torch.div(c, 2, rounding_mode="floor") / dim
    return float(base) ** (-exponent)  # (C,)


class ComplexOrderEmbedding(nn.Module):
    """Three ``(V, C)`` word tables, amplitude, frequency and phase, and the complex embedding they define.

    ``forward(tokens, positions)`` gathers each token's rows and calls :func:`complex_order_embedding`.
    Initialisation (the paper leaves it open; see the module docstring for the authors' code):

    * amplitude: ``N(0, amplitude_std²)``; the default 1 is ``nn.Embedding``'s, as in the authors' code;
    * frequency: the same vector for every word, from :func:`initial_frequencies` (``"sinusoidal"``,
      the default, or ``"transformer"``), or ``"uniform"``: independent ``U(0, π)`` per word and
      dimension (at integer positions a frequency only matters modulo ``2π``, and ``ω`` in
      ``(π, 2π)`` is turning backwards at speed ``2π - ω``; ``U(0, π)`` draws every forward speed).
      Shared frequencies make every inner product depend on the relative position only, at
      initialisation; training may move them apart;
    * phase: ``"uniform"`` on ``[0, 2π)`` (the default) or ``"zeros"`` (the authors' code).

    All three tables are trained.

    Args:
        vocab_size: ``V``.
        dim: ``C``, complex dimensions (``2C`` real numbers after :func:`to_real`).
        init_frequency: ``"sinusoidal"``, ``"transformer"`` or ``"uniform"``.
        init_phase: ``"uniform"`` or ``"zeros"``.
        base: frequency base of the ``"sinusoidal"`` and ``"transformer"`` initialisations.
        amplitude_std: standard deviation of the amplitudes.
        generator: random generator for the initialisation (default: the global one).
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        *,
        init_frequency: str = "sinusoidal",
        init_phase: str = "uniform",
        base: float = 10000.0,
        amplitude_std: float = 1.0,
        generator: Optional[torch.Generator] = None,
    ):
        super().__init__()
        _check_positive_int(vocab_size, "vocab_size")
        _check_positive_int(dim, "dim")
        if init_frequency not in FREQUENCY_INITS:
            raise ValueError(f"init_frequency must be one of {FREQUENCY_INITS}, got {init_frequency!r}")
        if init_phase not in PHASE_INITS:
            raise ValueError(f"init_phase must be one of {PHASE_INITS}, got {init_phase!r}")
        if isinstance(amplitude_std, bool) or not isinstance(amplitude_std, (int, float)) or not amplitude_std > 0:
            raise ValueError(f"amplitude_std must be a positive number, got {amplitude_std!r}")
        self.vocab_size, self.dim = vocab_size, dim
        shape = (vocab_size, dim)
        amplitude = torch.randn(shape, generator=generator) * amplitude_std  # (V, C)
        if init_frequency == "uniform":
            frequency = torch.rand(shape, generator=generator) * math.pi  # (V, C)
        else:
            frequency = initial_frequencies(dim, init_frequency, base).float().expand(shape).clone()  # (V, C)
        if init_phase == "uniform":
            phase = torch.rand(shape, generator=generator) * (2 * math.pi)  # (V, C)
        else:
            phase = torch.zeros(shape)
        self.amplitude = nn.Parameter(amplitude)
        self.frequency = nn.Parameter(frequency)
        self.phase = nn.Parameter(phase)

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """The complex embeddings of ``tokens`` at ``positions``.

        Args:
            tokens: ``(B, T)`` (or ``(T,)``) integer token ids in ``0 .. V - 1``.
            positions: ``(T,)`` integer positions.

        Returns:
            ``(B, T, C)`` (or ``(T, C)``) complex64 (complex128 if the tables are float64).

        Raises:
            TypeError: if ``tokens`` or ``positions`` is not an integer tensor.
            ValueError: if ``tokens`` is not 1-D or 2-D, has an id outside ``0 .. V - 1``, or its
                length differs from that of ``positions``.
        """
        integer = isinstance(tokens, Tensor) and not (tokens.dtype.is_floating_point or tokens.dtype.is_complex)
        if not integer or tokens.dtype == torch.bool:
            got = tokens.dtype if isinstance(tokens, Tensor) else type(tokens).__name__
            raise TypeError(f"tokens must be an integer tensor, got {got}")
        if tokens.dim() not in (1, 2):
            raise ValueError(f"tokens must be (B, T) or (T,), got shape {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(
                f"tokens must be in 0..{self.vocab_size - 1} (vocab_size={self.vocab_size}), "
                f"got values in {int(tokens.min())}..{int(tokens.max())}"
            )
        ids = tokens.to(self.amplitude.device)
        r, w, th = self.amplitude[ids], self.frequency[ids], self.phase[ids]  # (B, T, C) each
        return complex_order_embedding(r, w, th, positions)  # (B, T, C) complex

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, dim={self.dim}"
