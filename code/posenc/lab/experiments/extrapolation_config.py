"""The configuration of the length-extrapolation study: its grid, its scale, and named presets.

:class:`ExtrapolationStudy` is what :mod:`posenc.lab.experiments.extrapolation` runs: the methods,
seeds and tasks (the grid of cells), the training length ``L`` and the multiples of it evaluated,
the model's size, the training and fine-tuning budgets and what is evaluated. Every field is also
a command-line option (:mod:`posenc.lab.experiments.options`); a bad value raises ``ValueError``
naming the field, the value and what is allowed. :data:`PRESETS` are the CPU configuration (the
defaults) and the larger ``"gpu"`` one.

The CPU configuration: ``L = 128`` evaluated at 128, 256, 512 and 1024; width 64, 2 layers, 4
heads; 250 LM steps of 16 windows and 500 passkey steps of 32 rows (2-digit keys: in a seed-0 trial
ten of the sixteen methods retrieved them at ``L`` 95-100% of the time, Transformer-XL 78%, T5 50%,
ALiBi 32%, the raw integer, normalised and binary codes not at all), 5 depths, 32 passkey examples
per (length, depth), 32 validation windows per length; RoPE's fine-tunes (PI, YaRN and, as their control, no scaling) 50 steps at 1024. On the book's 2-core CPU
(one thread per process) a cell takes from 8 s (a learned table, LM) to 2 min (DeBERTa, passkey,
its relative terms at 1024 tokens): every registered method, 3 seeds and both tasks is about
55 CPU-minutes, half an hour in two processes under ``torchrun``. The ``"gpu"`` preset (``L = 1024``,
width 256, 6 layers, 4,000 and 3,000 steps, evaluated up to 8,192 tokens) is for one or more GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from posenc.lab.experiments.variants import SCALINGS
from posenc.method import METHODS

#: The tasks every model is trained on (one model per task).
TASKS = ("lm", "passkey")
#: Bytes of a passkey row besides the filler and the digits (a row of ``n`` digits with no filler has
#: ``PASSKEY_OVERHEAD + 2 n`` bytes: the key in the needle and the answer).
PASSKEY_OVERHEAD = len("The pass key is . Remember it. ") + len(" What is the pass key? The pass key is ")


@dataclass(frozen=True)
class ExtrapolationStudy:
    """The grid and the scale of the study. The defaults are the CPU configuration."""

    methods: tuple[str, ...] = ()  #: registered method names; none means every method in posenc.method.METHODS
    seeds: tuple[int, ...] = (0, 1, 2)  #: seeds of initialisation and data order, one model per seed
    tasks: tuple[str, ...] = TASKS  #: "lm" (byte LM) and/or "passkey"
    train_length: int = 128  #: L, the training window in tokens
    multiples: tuple[int, ...] = (1, 2, 4, 8)  #: evaluation lengths are L times these
    d_model: int = 64  #: model width C
    n_layer: int = 2  #: Transformer blocks
    n_head: int = 4  #: attention heads H (head dim C / H)
    lm_steps: int = 250  #: optimiser steps of the byte LM
    lm_batch: int = 16  #: windows per LM step (the global batch under --ddp)
    passkey_steps: int = 500  #: optimiser steps of the passkey model
    passkey_batch: int = 32  #: rows per passkey step (the global batch under --ddp)
    passkey_digits: int = 2  #: digits of the passkey
    lr: float = 3e-3  #: peak learning rate (AdamW, warmup then cosine decay)
    warmup_steps: int = 30  #: linear warmup steps
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  #: passkey depths, as the fraction of the filler before the key
    logn: bool = True  #: also evaluate every model with log-n attention scaling, past L
    scalings: tuple[str, ...] = SCALINGS  #: RoPE scalings evaluated zero-shot, factor = eval length / L
    #: RoPE scalings fine-tuned at finetune_length; "default" (no scaling) is their control
    finetune_scalings: tuple[str, ...] = ("default", "linear", "yarn")
    finetune_steps: int = 50  #: optimiser steps of each fine-tune
    finetune_length: Optional[int] = None  #: fine-tuning window (None means the longest evaluation length)
    finetune_batch: Optional[int] = None  #: rows per fine-tune step (None keeps the tokens per step of training)
    finetune_lr: float = 1e-3  #: peak learning rate of the fine-tunes
    eval_windows: int = 32  #: validation windows of the LM loss at each length
    eval_examples: int = 32  #: passkey examples at each (length, depth)
    eval_batch: int = 16  #: rows per evaluation forward pass (lower it for long lengths on a GPU)
    #: whether to follow the experiments protocol (every length scored on prefixes of the same windows, per-window and per-example scores kept, learning curves)
    protocol: bool = False
    curve_points: int = 8  #: measurements along each training run of a protocol study (after S/8, 2S/8, ..., S steps)
    #: each method's multiplier of its knob for the LM (position_lr or code_scale), as METHOD=VALUE (unlisted methods train at 1)
    lm_mults: tuple[str, ...] = ()
    #: the same for the passkey task
    passkey_mults: tuple[str, ...] = ()
    #: LM windows of each curve point (at L and at the longest length), every (eval_windows // curve_windows)-th evaluation window
    curve_windows: int = 32
    curve_examples: int = 16  #: passkey examples per depth and length of each curve point (at L and at the longest length)
    #: optimiser steps of the fine-tune without scaling, the control (None means finetune_steps)
    finetune_control_steps: Optional[int] = None

    def __post_init__(self) -> None:
        for name, ok, allowed in _RULES:
            if not ok(getattr(self, name)):
                raise ValueError(f"ExtrapolationStudy.{name} must be {allowed}, got {getattr(self, name)!r}")
        if (self.d_model // self.n_head) % 2 or self.d_model % self.n_head:
            raise ValueError(f"ExtrapolationStudy.n_head must divide d_model={self.d_model} into an even head dim "
                             f"(RoPE rotates pairs), got {self.n_head!r}")
        shortest = PASSKEY_OVERHEAD + 2 * self.passkey_digits
        if "passkey" in self.tasks and self.train_length < shortest:
            raise ValueError(f"ExtrapolationStudy.train_length must be >= {shortest} for the passkey task with "
                             f"passkey_digits={self.passkey_digits}, got {self.train_length!r}")
        if self.protocol and self.curve_windows > self.eval_windows:
            raise ValueError(f"ExtrapolationStudy.curve_windows must be <= eval_windows={self.eval_windows} under the "
                             f"protocol (the curve is measured on a subset of the evaluation windows), "
                             f"got {self.curve_windows!r}")
        if self.warmup_steps > min(self.lm_steps, self.passkey_steps):
            raise ValueError(f"ExtrapolationStudy.warmup_steps must be <= lm_steps and passkey_steps "
                             f"({self.lm_steps}, {self.passkey_steps}), got {self.warmup_steps!r}")

    # --- derived quantities

    @property
    def method_names(self) -> tuple[str, ...]:
        """The study's methods, ``methods`` or else every registered one (each checked to be registered).

        Raises:
            ValueError: for a name that is not registered.
        """
        names = self.methods or tuple(sorted(METHODS))
        for name in names:
            if name not in METHODS:
                raise ValueError(f"ExtrapolationStudy.methods has {name!r}, which is not registered; "
                                 f"registered methods: {sorted(METHODS)}")
        return names

    @property
    def eval_lengths(self) -> tuple[int, ...]:
        """``L * multiples``: the evaluation lengths."""
        return tuple(self.train_length * m for m in self.multiples)

    @property
    def longest(self) -> int:
        """The longest position any model of the study must cover (evaluation or fine-tuning)."""
        return max(self.eval_lengths[-1], self.finetune_length or 0)

    @property
    def finetune_window(self) -> int:
        """The fine-tuning length (``finetune_length`` or the longest evaluation length)."""
        return self.finetune_length or self.eval_lengths[-1]

    def mult(self, method: str, task: str) -> float:
        """The multiplier of ``method``'s knob on ``task`` (``lm_mults`` or ``passkey_mults``; 1 if unlisted)."""
        entries = dict(parse_mult(e) for e in (self.lm_mults if task == "lm" else self.passkey_mults))
        return entries.get(method, 1.0)

    def cells(self) -> list[tuple[str, int, str]]:
        """Every ``(method, seed, task)`` of the study, task by task, then seed by seed."""
        return [(m, s, t) for t in self.tasks for s in self.seeds for m in self.method_names]


def parse_mult(entry: str) -> tuple[str, float]:
    """``"METHOD=VALUE"`` as ``(METHOD, VALUE)``."""
    name, _, value = entry.partition("=")
    return name, float(value)


def _mults(v) -> bool:
    """A rule: distinct ``"METHOD=VALUE"`` entries, registered methods, values > 0."""
    if not isinstance(v, tuple):
        return False
    try:
        parsed = [parse_mult(e) for e in v]
    except (ValueError, AttributeError):
        return False
    names = [n for n, _ in parsed]
    return len(set(names)) == len(names) and all(n in METHODS and x > 0 for n, x in parsed)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _names(allowed: tuple[str, ...], empty: bool = True) -> Callable[[object], bool]:
    """A rule: a tuple of distinct names from ``allowed`` (or any str if ``allowed`` is empty)."""
    def ok(v) -> bool:
        return isinstance(v, tuple) and (empty or bool(v)) and len(set(v)) == len(v) and all(
            isinstance(x, str) and (not allowed or x in allowed) for x in v)
    return ok


_POSITIVE = (lambda v: _is_int(v) and v >= 1, "a positive int")
_POSITIVE_OR_NONE = (lambda v: v is None or (_is_int(v) and v >= 1), "a positive int or None")
_NUMBER = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, "a number > 0")
#: ``(field, rule, what is allowed)`` for every field of :class:`ExtrapolationStudy`.
_RULES = [(name, *_POSITIVE) for name in ("train_length", "d_model", "n_layer", "n_head", "lm_steps", "lm_batch",
                                          "passkey_steps", "passkey_batch", "passkey_digits", "eval_windows",
                                          "eval_examples", "eval_batch")] + [
    ("finetune_length", *_POSITIVE_OR_NONE), ("finetune_batch", *_POSITIVE_OR_NONE),
    ("finetune_steps", lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    ("warmup_steps", lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    ("lr", *_NUMBER), ("finetune_lr", *_NUMBER), ("logn", lambda v: isinstance(v, bool), "a bool"),
    ("protocol", lambda v: isinstance(v, bool), "a bool"), ("curve_points", *_POSITIVE),
    ("curve_windows", *_POSITIVE), ("curve_examples", *_POSITIVE), ("finetune_control_steps", *_POSITIVE_OR_NONE),
    ("lm_mults", _mults, "a tuple of distinct METHOD=VALUE entries, registered methods and values > 0"),
    ("passkey_mults", _mults, "a tuple of distinct METHOD=VALUE entries, registered methods and values > 0"),
    ("methods", _names(()), "a tuple of distinct registered method names (empty: all)"),
    ("tasks", _names(TASKS, empty=False), f"a non-empty tuple of distinct names from {TASKS}"),
    ("scalings", _names(SCALINGS), f"a tuple of distinct names from {SCALINGS}"),
    ("finetune_scalings", _names(("default",) + SCALINGS), f"a tuple of distinct names from {('default',) + SCALINGS}"),
    ("seeds", lambda v: isinstance(v, tuple) and bool(v) and all(map(_is_int, v)) and len(set(v)) == len(v),
     "a non-empty tuple of distinct ints"),
    ("multiples", lambda v: isinstance(v, tuple) and bool(v) and all(_is_int(x) and x >= 1 for x in v)
     and list(v) == sorted(set(v)), "a non-empty increasing tuple of positive ints, e.g. (1, 2, 4, 8)"),
    ("depths", lambda v: isinstance(v, tuple) and bool(v) and all(
        isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1 for d in v),
     "a non-empty tuple of numbers in [0, 1]"),
]


#: The named configurations, ``"cpu"`` (the defaults), ``"protocol"`` and ``"gpu"``. ``"protocol"`` is
#: the CPU model under the experiments protocol, with the methods study's budgets (4,000 LM steps as
#: ``compare.PROTOCOL_LM_STEPS`` and 3,000 passkey steps as ``compare.PROTOCOL_COPY_STEPS``), 256
#: windows and 128 passkey examples per depth at each length (the learning curves on every 8th of those
#: windows and on the first 16 of those examples), fine-tunes of 100 steps and 1,000 for
#: the control without scaling (ten times as many, as in Chen et al.'s comparison of position
#: interpolation with plain fine-tuning, arXiv:2306.15595, 1,000 against 10,000 steps), and the
#: tuned multipliers given with ``--tuned-from``. ``"gpu"`` is wider, deeper and longer (L = 1024).
PRESETS: dict[str, ExtrapolationStudy] = {
    "cpu": ExtrapolationStudy(),
    "protocol": ExtrapolationStudy(protocol=True, lm_steps=4000, passkey_steps=3000, eval_windows=256, eval_examples=128,
                                   finetune_steps=100, finetune_control_steps=1000),
    "gpu": ExtrapolationStudy(train_length=1024, d_model=256, n_layer=6, n_head=8, lm_steps=4000, lm_batch=32,
                              passkey_steps=3000, passkey_batch=32, passkey_digits=5, lr=1e-3, warmup_steps=200,
                              finetune_steps=200, finetune_lr=3e-4, eval_windows=64, eval_examples=128, eval_batch=2),
}
