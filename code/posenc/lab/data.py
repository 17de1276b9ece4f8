"""Data that needs no download: a byte-level corpus of Python source, and seeded synthetic tasks.

**The corpus** is the source code of the Python standard library's top-level modules
(``<stdlib>/*.py``, e.g. ``abc.py`` ... ``zipimport.py``), read at run time from the running
interpreter. Files are taken in sorted order; every ``val_every``-th file goes to the validation
split, so the two splits share no file. Tokens are bytes (vocabulary 256). On CPython 3.11 this is
168 files and about 4.7 MB; other Python versions ship slightly different files, so
:attr:`Corpus.fingerprint` identifies the exact corpus a result was obtained on.

**Synthetic tasks** (copy, associative recall, passkey retrieval) are byte strings too, so the
same byte-level LM can be trained or probed on them. Each returns a :class:`Task` of inputs,
next-token targets and a mask of the target positions that are scored.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class Corpus:
    """A byte corpus split into training and validation bytes by file."""

    train: Tensor  #: (N_train,) uint8
    val: Tensor  #: (N_val,) uint8
    train_files: tuple[str, ...]  #: file names, in corpus order
    val_files: tuple[str, ...]
    root: str  #: directory the files were read from
    fingerprint: str  #: first 16 hex digits of the SHA-256 of all bytes (train then val)

    def describe(self) -> str:
        """One line: files, bytes per split, origin and fingerprint."""
        return (
            f"{len(self.train_files)} train files ({self.train.numel():,} bytes), "
            f"{len(self.val_files)} validation files ({self.val.numel():,} bytes) "
            f"from {self.root} [sha256 {self.fingerprint}]"
        )


def stdlib_root() -> Path:
    """Directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=4)
def load_stdlib_corpus(val_every: int = 10, root: Optional[Union[str, Path]] = None) -> Corpus:
    """Read the standard library's top-level ``*.py`` files into a byte :class:`Corpus`.

    Args:
        val_every: file ``i`` (in sorted order) goes to validation when ``i % val_every == 0``.
        root: directory to read instead of the interpreter's standard library (for tests).

    Returns:
        The corpus; files are separated by one newline byte.

    Raises:
        ValueError: if ``val_every < 2`` or the directory holds fewer than ``val_every`` ``.py`` files.
    """
    if not isinstance(val_every, int) or val_every < 2:
        raise ValueError(f"val_every must be an int >= 2, got {val_every!r}")
    root = stdlib_root() if root is None else Path(root)
    files = sorted(root.glob("*.py"))
    if len(files) < val_every:
        raise ValueError(f"{root} holds {len(files)} .py files; need at least val_every={val_every}")
    parts: dict[str, list] = {"train": [], "val": []}
    names: dict[str, list] = {"train": [], "val": []}
    for i, path in enumerate(files):
        split = "val" if i % val_every == 0 else "train"
        parts[split].append(path.read_bytes() + b"\n")
        names[split].append(path.name)
    blobs = {split: b"".join(chunks) for split, chunks in parts.items()}
    digest = hashlib.sha256(blobs["train"] + blobs["val"]).hexdigest()[:16]
    tensors = {split: torch.frombuffer(bytearray(blob), dtype=torch.uint8) for split, blob in blobs.items()}
    return Corpus(
        train=tensors["train"], val=tensors["val"],
        train_files=tuple(names["train"]), val_files=tuple(names["val"]),
        root=str(root), fingerprint=digest,
    )


def _check_windows(data: Tensor, count: int, seq_len: int, count_name: str) -> None:
    if not isinstance(data, Tensor) or data.dim() != 1:
        raise ValueError(f"data must be a 1-D tensor of token ids, got {getattr(data, 'shape', type(data).__name__)}")
    for name, value in ((count_name, count), ("seq_len", seq_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if data.numel() < seq_len + 1:
        raise ValueError(f"data has {data.numel()} tokens; a window of seq_len={seq_len} needs {seq_len + 1}")


def random_batch(
    data: Tensor, batch_size: int, seq_len: int, generator: torch.Generator, device=None
) -> tuple[Tensor, Tensor]:
    """Random windows of ``data`` and their next-token targets.

    Args:
        data: ``(N,)`` token ids.
        batch_size: ``B``.
        seq_len: ``T``.
        generator: CPU generator that picks the window starts (seeded by the caller).
        device: device of the returned tensors.

    Returns:
        ``(x, y)``, each ``(B, T)`` int64, with ``y[:, t] = data[start + t + 1]``.
    """
    _check_windows(data, batch_size, seq_len, "batch_size")
    starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=generator)  # (B,)
    idx = starts[:, None] + torch.arange(seq_len + 1)  # (B, T + 1)
    seq = data[idx].long()
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def eval_windows(data: Tensor, seq_len: int, num_windows: int, device=None, *, span: Optional[int] = None,
                 between: bool = False) -> tuple[Tensor, Tensor]:
    """Evenly spaced, deterministic windows of ``data`` for evaluation.

    Args:
        data: ``(N,)`` token ids.
        seq_len: window length ``T``.
        num_windows: windows.
        device: device of the returned tensors.
        span: space the windows as if they were ``span`` tokens long (``span >= seq_len``): the
            windows of every length up to ``span`` then start at the same tokens, each a prefix of
            the longest, so that scores at several lengths are on the same text. ``None``: ``seq_len``.
        between: instead, the ``num_windows - 1`` windows that start halfway between consecutive
            windows of ``between=False``: other text of the same kind, disjoint from those windows
            when their spacing is at least twice ``span`` (held-out text for choosing a setting,
            apart from the text that reports it).

    Returns:
        ``(x, y)``, each ``(num_windows, seq_len)`` int64 (``num_windows - 1`` rows with ``between``).

    Raises:
        ValueError: if ``data`` is too short for one window of ``span`` tokens, ``span < seq_len``, or
            ``between`` with fewer than 2 windows.
    """
    _check_windows(data, num_windows, seq_len, "num_windows")
    if span is not None:
        if not isinstance(span, int) or isinstance(span, bool) or span < seq_len:
            raise ValueError(f"span must be an int >= seq_len={seq_len} or None, got {span!r}")
        _check_windows(data, num_windows, span, "num_windows")
    last = data.numel() - (span or seq_len) - 1
    starts = torch.arange(num_windows) * last // max(num_windows - 1, 1)  # (num_windows,), exact integers
    if between:
        if num_windows < 2:
            raise ValueError(f"between=True needs num_windows >= 2, got {num_windows}")
        starts = (starts[:-1] + starts[1:]) // 2  # (num_windows - 1,)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    seq = data[idx].long()
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


# --- synthetic tasks -------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A batch of a synthetic task: next-token targets, scored only where ``mask`` is True."""

    inputs: Tensor  #: (B, T) int64 bytes
    targets: Tensor  #: (B, T) int64, the next token of every input (``inputs`` shifted by one)
    mask: Tensor  #: (B, T) bool, True where the target is part of the answer

    def text(self, row: int = 0) -> str:
        """The full byte sequence of one example (input plus final target), decoded."""
        seq = torch.cat([self.inputs[row], self.targets[row, -1:]])
        return bytes(seq.tolist()).decode("latin-1")


def _task(seqs: list[bytes], answer_starts: list[int]) -> Task:
    lengths = {len(s) for s in seqs}
    if len(lengths) != 1:  # pragma: no cover - the builders make equal lengths
        raise AssertionError("synthetic sequences must share a length")
    full = torch.tensor([list(s) for s in seqs], dtype=torch.long)  # (B, T + 1)
    inputs, targets = full[:, :-1], full[:, 1:]
    pos = torch.arange(targets.shape[1])  # target t is byte t + 1
    mask = (pos[None, :] + 1) >= torch.tensor(answer_starts)[:, None]  # (B, T)
    return Task(inputs=inputs, targets=targets, mask=mask)


def _check_positive(**kwargs) -> None:
    for name, value in kwargs.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


_LETTERS = b"abcdefghijklmnopqrstuvwxyz"
_DIGITS = b"0123456789"


def copy_task(batch_size: int, length: int, generator: torch.Generator) -> Task:
    """Copy a random lowercase string: ``"qzbk|qzbk"``; the answer is the part after ``|``.

    Returns:
        A :class:`Task` with ``T = 2 * length``.
    """
    _check_positive(batch_size=batch_size, length=length)
    letters = torch.randint(0, 26, (batch_size, length), generator=generator)
    seqs = []
    for row in letters.tolist():
        s = bytes(_LETTERS[i] for i in row)
        seqs.append(s + b"|" + s)
    return _task(seqs, [length + 1] * batch_size)


def associative_recall(batch_size: int, num_pairs: int, generator: torch.Generator) -> Task:
    """Key-value recall: ``"c7a2f9|a"`` followed by the answer ``"2"``.

    Keys are distinct lowercase letters, values digits; the query is one of the keys.

    Returns:
        A :class:`Task` with ``T = 2 * num_pairs + 2`` and one scored target per row (the last).

    Raises:
        ValueError: if ``num_pairs`` is not in 1..26.
    """
    _check_positive(batch_size=batch_size, num_pairs=num_pairs)
    if num_pairs > 26:
        raise ValueError(f"num_pairs must be at most 26 (distinct letter keys), got {num_pairs}")
    seqs = []
    for _ in range(batch_size):
        keys = torch.randperm(26, generator=generator)[:num_pairs].tolist()
        values = torch.randint(0, 10, (num_pairs,), generator=generator).tolist()
        query = int(torch.randint(0, num_pairs, (1,), generator=generator))
        body = b"".join(bytes([_LETTERS[k], _DIGITS[v]]) for k, v in zip(keys, values))
        seqs.append(body + b"|" + bytes([_LETTERS[keys[query]], _DIGITS[values[query]]]))
    return _task(seqs, [2 * num_pairs + 2] * batch_size)


_FILLER = b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
_QUESTION = b" What is the pass key? The pass key is "


def passkey_retrieval(
    batch_size: int, length: int, generator: torch.Generator, num_digits: int = 5, depth: Optional[float] = None
) -> Task:
    """Passkey retrieval (Mohtashami & Jaggi 2023, arXiv:2305.16300): find a number hidden in filler text.

    Each row is filler text with ``"The pass key is 12345. Remember it. "`` inserted at a depth,
    then the question; the answer is the digits. Rows share the length ``length``.

    Args:
        batch_size: ``B``.
        length: total bytes of each row including the answer (``T = length - 1``).
        generator: seeds the passkeys and (when ``depth`` is ``None``) the depths.
        num_digits: digits of the passkey.
        depth: where the needle goes, as the fraction of the filler before it: ``0`` puts it first,
            ``1`` last, just before the question (``round(depth * F)`` of the ``F`` filler bytes
            precede it). ``None`` draws a depth per row uniformly from ``0 .. F`` bytes.

    Raises:
        ValueError: if ``length`` is too short to hold the needle, the question and the answer, or
            ``depth`` is not ``None`` or a number in ``[0, 1]``.
    """
    _check_positive(batch_size=batch_size, length=length, num_digits=num_digits)
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1):
        raise ValueError(
            "depth must be None (random) or a number in [0, 1] (the fraction of the filler before the needle), "
            f"got {depth!r}"
        )
    overhead = len(b"The pass key is . Remember it. ") + len(_QUESTION) + 2 * num_digits
    if length < overhead:
        raise ValueError(f"length must be at least {overhead} for num_digits={num_digits}, got {length}")
    filler_len = length - overhead
    filler = (_FILLER * (filler_len // len(_FILLER) + 1))[:filler_len]
    seqs, starts = [], []
    for _ in range(batch_size):
        key = bytes(_DIGITS[d] for d in torch.randint(0, 10, (num_digits,), generator=generator).tolist())
        if depth is None:
            cut = int(torch.randint(0, filler_len + 1, (1,), generator=generator))
        else:
            cut = round(depth * filler_len)
        needle = b"The pass key is " + key + b". Remember it. "
        seq = filler[:cut] + needle + filler[cut:] + _QUESTION + key
        seqs.append(seq)
        starts.append(len(seq) - num_digits)
    return _task(seqs, starts)
