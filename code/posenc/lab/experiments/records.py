"""Stored results: provenance of a run, and a JSON file of records shared by several processes.

Every study of :mod:`posenc.lab.experiments` writes one JSON file ``{"meta": {...}, "records": [...]}``.
Records are appended as they finish, under an exclusive lock (``fcntl.flock`` on ``FILE.lock``)
and by an atomic rename, so that an interrupted run loses at most the work in progress and
several processes may share one file. Each record is stamped (:func:`stamp`) with the
:func:`provenance` of the process that made it (commit, dirty flag, versions, hardware, threads)
and its command line.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import platform
import subprocess
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


def provenance(device: str | torch.device) -> dict:
    """What produced a result: commit, whether ``code/`` had uncommitted changes, versions, hardware.

    Read it once, before training: it then describes the code this process imported.

    Args:
        device: the device the run uses (a CUDA device is named by its GPU, the CPU by its model).

    Returns:
        ``{"commit", "dirty", "torch", "python", "machine", "cpu_count", "threads", "device"}``
        (``commit`` is ``""`` outside a git checkout).
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
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "device": dev}


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

