"""The package as an engineer gets it: build the sdist and the wheel, install the wheel into a fresh
virtual environment outside the repository, and use it from there.

The editable install that `make` uses puts ``code/`` on the import path, which hides a wheel that
leaves a module out; these tests never import from the repository. The fresh environment sees the
test environment's site-packages (torch, numpy, tqdm) through a plain path entry, which adds them to
``sys.path`` without running the ``.pth`` files there, so the editable ``posenc`` stays invisible.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "code" / "posenc"
BUILD_STATE = (".git", ".venv", "_build", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")


def source_modules() -> set[str]:
    """Dotted names of every module and package under code/posenc, found by walking the tree."""
    names = set()
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and a wheel built from it (``python -m build`` builds the wheel from the sdist)."""
    pytest.importorskip("build", reason="the 'build' package is needed (it is in requirements.txt)")
    out = tmp_path_factory.mktemp("dist")
    # Build from a copy without build state: a stale code/posenc.egg-info lists every file it saw
    # once, and setuptools then ships modules that the package configuration would leave out.
    source = tmp_path_factory.mktemp("source") / "posenc"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*BUILD_STATE))
    # --no-isolation: use this environment's setuptools instead of downloading one.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """Python of a fresh virtual environment with the wheel installed by pip; returns its interpreter."""
    env = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # The dependencies come from the test environment: a path entry, not a site directory.
    (site / "test_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = dist.glob("posenc-*.whl")
    # pip checks the declared dependencies against what the new environment sees; --no-index: no download.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        cwd=env,
    )
    return python


def run_isolated(python: Path, code: str, cwd: Path) -> str:
    """Run ``code`` with ``-I`` (no PYTHONPATH, no current directory on sys.path) from ``cwd``."""
    result = subprocess.run(
        [str(python), "-I", "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_wheel_contains_every_module_of_the_source_tree(dist):
    (wheel,) = dist.glob("posenc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    expected = {str(p.relative_to(SOURCE.parent)) for p in SOURCE.rglob("*.py")}
    assert expected <= set(names), f"missing from the wheel: {sorted(expected - set(names))}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "posenc/py.typed" in names  # type checkers read the package's annotations


def test_sdist_contains_the_tests_the_license_and_the_package(dist):
    (sdist,) = dist.glob("posenc-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    tests = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")}
    package = {str(p.relative_to(ROOT)) for p in SOURCE.rglob("*.py")}
    for needed in ({"LICENSE", "README.md", "pyproject.toml"}, tests, package):
        assert needed <= names, f"missing from the sdist: {sorted(needed - names)}"


def test_installed_wheel_imports_every_module_from_outside_the_repository(installed, tmp_path):
    out = run_isolated(
        installed,
        """
        import importlib, json, pkgutil, sys
        import posenc, posenc.relative, posenc.rope
        names = {"posenc"}
        for info in pkgutil.walk_packages(posenc.__path__, "posenc."):
            importlib.import_module(info.name)
            names.add(info.name)
        print(json.dumps({"file": posenc.__file__, "modules": sorted(names), "path": sys.path}))
        """,
        tmp_path,
    )
    found = json.loads(out)
    assert not Path(found["file"]).resolve().is_relative_to(ROOT), f"posenc imported from the repository: {found}"
    assert not any(Path(p).resolve() == ROOT or Path(p).resolve() == ROOT / "code" for p in found["path"] if p)
    assert set(found["modules"]) == source_modules()


def test_installed_wheel_declares_the_runtime_dependencies(installed, tmp_path):
    out = run_isolated(
        installed,
        """
        from importlib.metadata import requires
        print("\\n".join(sorted(requires("posenc"))))
        """,
        tmp_path,
    )
    assert out.split() == ["numpy>=1.24", "torch>=2.1", "tqdm>=4.60"]


def test_installed_wheel_runs_a_tiny_model_with_rope_alibi_and_t5_bias(installed, tmp_path):
    out = run_isolated(
        installed,
        """
        import torch
        from posenc.lab import LMConfig, TinyLM

        torch.manual_seed(0)
        cfg = LMConfig(vocab_size=256, d_model=32, n_layer=2, n_head=4, max_len=32)
        tokens = torch.randint(0, 256, (2, 32))
        for name in ("rope", "alibi", "t5"):
            logits = TinyLM(cfg, name)(tokens)
            assert logits.shape == (2, 32, 256) and torch.isfinite(logits).all(), name
            print(name)
        """,
        tmp_path,
    )
    assert out.split() == ["rope", "alibi", "t5"]
