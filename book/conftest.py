"""nbval runs the chapters (``make test``); this keeps what it executed for the book build.

``make test`` executes every chapter once, under nbval, cell by cell as tests. When
``POSENC_NB_CACHE`` names a jupyter-cache folder (the book's ``_build/.jupyter_cache``), each
chapter whose cells all passed is stored there with the outputs nbval collected, exactly as
MyST-NB stores a notebook it executed itself. The strict book build that follows finds every
chapter in its cache and renders it instead of executing it a second time; a chapter that is not
there (a failed cell, or a plain ``make book``) is executed by the build as usual.

Nothing happens without ``POSENC_NB_CACHE``. Safe under pytest-xdist: each chapter runs whole in
one worker, and writes to the cache are serialised by a lock file.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

CACHE = os.environ.get("POSENC_NB_CACHE")
_started: dict[str, float] = {}
_failed: set[str] = set()


def _store(notebook_file, nb, seconds: float) -> None:
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache_dir = Path(CACHE)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir.parent / ".jupyter_cache.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = get_cache(str(cache_dir))
        cache.cache_notebook_bundle(
            CacheBundleIn(nb, str(notebook_file), data={"execution_seconds": seconds}),
            check_validity=False,
            overwrite=True,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if CACHE is None or not hasattr(item, "test_outputs") or not hasattr(item, "cell_num"):
        return
    notebook = item.parent
    key = str(notebook.fspath)
    if call.when == "setup":
        _started.setdefault(key, time.perf_counter())
        return
    if call.when != "call":
        return
    report = outcome.get_result()
    if not report.passed or item.test_outputs is None:
        _failed.add(key)
        return
    item.cell.outputs = list(item.test_outputs)
    item.cell.execution_count = item.cell_num + 1
    for output in item.cell.outputs:
        if output.get("output_type") == "execute_result":
            output["execution_count"] = item.cell_num + 1
    code_cells = sum(cell.cell_type == "code" for cell in notebook.nb.cells)
    if item.cell_num == code_cells - 1 and key not in _failed:
        _store(notebook.fspath, notebook.nb, time.perf_counter() - _started[key])
