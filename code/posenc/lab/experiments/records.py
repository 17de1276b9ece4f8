"""Stored results: provenance of a run, and a JSON file of records shared by several processes.

Every study of :mod:`posenc.lab.experiments` writes one JSON file ``{"meta": {...}, "records": [...]}``.
Records are appended as they finish, under an exclusive lock (``fcntl.flock`` on ``FILE.lock``)
and by an atomic rename, so that an interrupted run loses at most the work in progress and
several processes may share one file. Each record is stamped (:func:`stamp`) with the
:func:`provenance` of the process that made it (commit, dirty flag, versions, hardware, threads)
and its command line; :func:`check_provenance` refuses to mix records of several versions of the
code in one study.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterator, Sequence

import torch

#: Where the book's stored studies live, relative to the repository root.
RESULTS_DIR = Path("book") / "results"

#: The repository root (where ``git`` is asked for the commit).
_ROOT = Path(__file__).resolve().parents[3]


def cpu_name() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_capability() -> str:
    """The instruction set PyTorch's CPU kernels dispatch to here (``"AVX2"``, ``"AVX512"``, ...; ``""`` if unknown).

    Two processors with the same model name can differ in it (AMD EPYC generations do), and kernels of
    different instruction sets round some operations differently.
    """
    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return get() if get is not None else ""


def provenance(device: str | torch.device) -> dict:
    """What produced a result: commit, whether ``code/`` had uncommitted changes, versions, hardware.

    Read it once, before training: it then describes the code this process imported.

    Args:
        device: the device the run uses (a CUDA device is named by its GPU, the CPU by its model).

    Returns:
        ``{"commit", "dirty", "torch", "python", "machine", "cpu_capability", "cpu_count", "threads", "device"}``
        (``commit`` is ``""`` outside a git checkout; ``cpu_capability`` is :func:`cpu_capability`).
    """
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dev = str(device)
    hardware = torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else cpu_name()
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "code")),
            "torch": torch.__version__, "python": platform.python_version(), "machine": hardware,
            "cpu_capability": cpu_capability(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "device": dev}


#: How far a live rerun's 10-step mean training losses may be from the stored run's over its first
#: steps, on any processor (:func:`check_rerun`): rounding differences have not grown yet there.
EARLY_TOLERANCE = 1e-3
#: How far a live rerun's final value may be from the stored one on the processor, torch version and
#: thread count that made the stored run (where the same code, seed and data give the same numbers).
SAME_PROCESSOR_TOLERANCE = 2e-3
#: How far it may be on another processor, whose kernels round some operations differently. Training
#: amplifies such differences (after 500 steps of the tiny LM, measured up to 0.015 nats/byte between an Intel
#: Xeon and an AMD EPYC), so the bound there only catches a gross error.
OTHER_PROCESSOR_TOLERANCE = 0.05


@dataclass(frozen=True)
class Rerun:
    """What :func:`check_rerun` found."""

    early_gap: float  #: largest ``|difference|`` of the 10-step mean training losses over the first steps
    early_steps: int  #: how many first steps ``early_gap`` covers
    gap: float  #: ``|live_value - stored_value|``
    same_processor: bool  #: whether the live run ran on the processor, torch and threads of the stored run
    tolerance: float  #: the bound ``gap`` was held to


def check_rerun(live: dict, stored: dict, live_value: float, stored_value: float, *, early_steps: int = 200) -> Rerun:
    """Check that a live rerun of a stored run is the same run, as far as floating point allows.

    Training amplifies rounding. Two runs with the same code, seed and data on processors whose
    kernels round some operations differently agree to about ``1e-4`` at first and drift apart
    later, by a few thousandths of a nat after a few hundred steps. So the check has two parts: the
    10-step mean training losses (``train_loss_every_10``) of the first ``early_steps`` steps agree
    to :data:`EARLY_TOLERANCE` on any processor (a wrong seed, scale or step size differs there by
    0.09 or more in the tiny LM); and the final values agree to :data:`SAME_PROCESSOR_TOLERANCE`
    where the live run has the stored run's processor (``machine``, and ``cpu_capability`` where the
    record has it), torch version and thread count, to :data:`OTHER_PROCESSOR_TOLERANCE` elsewhere.

    Args:
        live: the live run's record (from ``run_cell``), with ``train_loss_every_10``.
        stored: the stored record, with ``train_loss_every_10``, ``machine``, ``torch`` and ``threads``.
        live_value: the live run's value to compare (e.g. its last curve point's loss).
        stored_value: the stored value at the same point.
        early_steps: how many first steps of training losses to compare (a multiple of 10).

    Returns:
        A :class:`Rerun`.

    Raises:
        ValueError: if ``early_steps`` is not a positive multiple of 10, or either record has fewer
            training losses than that.
        AssertionError: if the two runs trained on different corpora (their ``corpus`` fingerprints,
            where both records have one), or the early losses or the final values differ by more
            than allowed (the message gives both differences).
    """
    if isinstance(early_steps, bool) or not isinstance(early_steps, int) or early_steps <= 0 or early_steps % 10:
        raise ValueError(f"early_steps must be a positive multiple of 10, got {early_steps!r}")
    if live.get("corpus") and stored.get("corpus") and live["corpus"] != stored["corpus"]:
        raise AssertionError(f"the live rerun trained on another corpus (fingerprint {live['corpus']}, the stored run's "
                             f"{stored['corpus']}): the corpus is the standard library of the Python that runs it, here "
                             f"{platform.python_version()}, for the stored run {stored.get('python', 'not recorded')}")
    n = early_steps // 10
    a, b = live.get("train_loss_every_10", []), stored.get("train_loss_every_10", [])
    if min(len(a), len(b)) < n:
        raise ValueError(f"early_steps={early_steps} needs {n} training losses in each record; "
                         f"the live record has {len(a)}, the stored one {len(b)}")
    early_gap = max(abs(x - y) for x, y in zip(a[:n], b[:n]))
    same = (stored.get("machine") == cpu_name() and stored.get("torch") == torch.__version__
            and stored.get("threads") == torch.get_num_threads()
            and stored.get("cpu_capability", cpu_capability()) == cpu_capability())
    tolerance = SAME_PROCESSOR_TOLERANCE if same else OTHER_PROCESSOR_TOLERANCE
    gap = abs(live_value - stored_value)
    result = Rerun(early_gap, early_steps, gap, same, tolerance)
    if early_gap > EARLY_TOLERANCE or gap > tolerance:
        raise AssertionError(f"the live rerun is not the stored run: training losses of the first {early_steps} steps "
                             f"differ by up to {early_gap:.2e} (allowed {EARLY_TOLERANCE:g}), final values by {gap:.2e} "
                             f"(allowed {tolerance:g} {'on the same' if same else 'on another'} processor: "
                             f"{cpu_name()} here, {stored.get('machine')!r} stored)")
    return result


def check_provenance(stored: Sequence[dict], new: Sequence[dict], where: str | Path, *,
                     allow_mixed: bool = False) -> None:
    """Refuse to add records made by other code than the records already stored.

    A study read as one must come from one version of the code: every record stored and every
    process about to add records must have the same ``commit`` and ``dirty`` flag (as
    :func:`provenance` gives them and :func:`stamp` stores them). Two dirty trees at one commit
    cannot be told apart by these two fields, so they pass.

    Args:
        stored: the records already stored (stamped, with ``"commit"`` and ``"dirty"``).
        new: the :func:`provenance` of each process about to add records.
        where: the stored file, named in the message.
        allow_mixed: add the records anyway (the records keep their own provenance).

    Raises:
        ValueError: if the records and processes do not share one commit and dirty flag, and
            ``allow_mixed`` is false (the message names the stored and the new commits and flags).
    """
    if allow_mixed:
        return
    have = sorted({(r.get("commit"), r.get("dirty")) for r in stored}, key=str)
    adding = sorted({(p.get("commit"), p.get("dirty")) for p in new}, key=str)
    if len(set(have) | set(adding)) <= 1:
        return
    name = lambda pairs: " and ".join(f"commit {c or 'unknown'} (dirty={d})" for c, d in pairs)  # noqa: E731
    found = (f"{where} holds records made at {name(have)}, and this run is at {name(adding)}" if have
             else f"the processes of this run, adding to {where}, are at {name(adding)}")
    raise ValueError(f"{found}: a study made by several versions of the code cannot be read as one. Run one "
                     "version into another file (--out), or allow the mix explicitly (--allow-mixed-commits, "
                     "allow_mixed=True)")


def stamp(record: dict, provenance: dict, command: str) -> dict:
    """``record`` with the provenance, the command line and the finishing time (UTC) added."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return dict(record, **provenance, command=command, finished=now)


def load_records(path: str | Path) -> dict:
    """Read a stored study (``{"meta": ..., "records": [...]}``).

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    return json.loads(Path(path).read_text())


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (the file ``path.lock`` beside it) for the ``with`` block.

    Creates the parent folder if needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def finished_keys(path: str | Path, key: Callable[[dict], Hashable]) -> set:
    """``{key(record)}`` over the records stored in ``path`` (empty if the file does not exist yet)."""
    path = Path(path)
    if not path.exists():
        return set()
    return {key(r) for r in load_records(path)["records"]}


def append_records(path: str | Path, records: Sequence[dict], key: Callable[[dict], Hashable],
                   meta: Callable[[list[dict]], dict], *, one_per_line: bool = False) -> dict:
    """Add ``records`` to the study stored in ``path``, replacing stored records with the same key.

    Read, merge and write happen under :func:`locked`; the file is written to ``path.tmp`` and
    renamed over ``path``, so a reader never sees half a file.

    Args:
        path: the JSON file (created with its folder if missing).
        records: the new records (already :func:`stamp` ed).
        key: what identifies a record; a stored record whose key a new one has is dropped.
        meta: builds ``data["meta"]`` from all the records after the merge.
        one_per_line: write each record on one line with no spaces (compact, one diff line per record)
            instead of indenting every value.

    Returns:
        The stored study after the write.
    """
    path = Path(path)
    with locked(path):
        data = load_records(path) if path.exists() else {"meta": {}, "records": []}
        new = {key(r) for r in records}
        data["records"] = [r for r in data["records"] if key(r) not in new] + list(records)
        data["meta"] = meta(data["records"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(_dumps(data, one_per_line) + "\n")
        tmp.replace(path)
    return data


def _dumps(data: dict, one_per_line: bool) -> str:
    if not one_per_line:
        return json.dumps(data, indent=1)
    lines = ",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in data["records"])
    meta = json.dumps(data["meta"], indent=1).replace("\n", "\n ")
    return '{\n "meta": ' + meta + ',\n "records": [\n' + lines + "\n ]\n}"

