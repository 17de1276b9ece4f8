"""Tests of the repository layout and the build configuration the design card prescribes."""

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


def test_code_is_a_plain_folder():
    assert (ROOT / "code" / "posenc" / "__init__.py").is_file()
    assert not (ROOT / "code" / "__init__.py").exists(), "code/ must never be a package"


def test_import_code_from_repo_root_is_the_standard_library():
    """`import code` (used by pdb and IPython) must not pick up the repo's code/ folder."""
    script = "import code, pdb, sys; print(code.__file__); assert hasattr(code, 'InteractiveConsole')"
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    path = Path(out.stdout.strip())
    assert path.name == "code.py" and ROOT not in path.parents


def test_posenc_is_importable_from_the_installed_package():
    out = subprocess.run(
        [sys.executable, "-c", "import posenc; print(posenc.__file__)"], cwd="/", capture_output=True, text=True, check=True
    )
    assert Path(out.stdout.strip()) == ROOT / "code" / "posenc" / "__init__.py"


def test_notebooks_are_committed_without_outputs():
    assert NOTEBOOKS, "no chapter notebooks found"
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code":
                assert not cell.get("outputs"), f"{path.name} cell {i} has outputs"
                assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


def _toc_files(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("file", "root"):
                yield value
            else:
                yield from _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            yield from _toc_files(item)


def test_every_chapter_notebook_is_in_the_toc_and_every_toc_entry_exists():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    entries = set(_toc_files(toc))
    for entry in entries:
        assert list(ROOT.glob(entry + ".*")), f"_toc.yml names {entry}, which does not exist"
    for path in NOTEBOOKS:
        assert str(path.relative_to(ROOT).with_suffix("")) in entries, f"{path.name} is not in _toc.yml"


def test_book_config_is_strict():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["only_build_toc_files"] is True
    assert config["sphinx"]["config"]["nb_execution_raise_on_error"] is True
    assert config["sphinx"]["config"]["bibtex_reference_style"] == "author_year"
    assert {"dollarmath", "amsmath"} <= set(config["parse"]["myst_enable_extensions"])
    assert config["bibtex_bibfiles"] == ["book/references.bib"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"jupyter-book build \. -W -n --keep-going", makefile)


def test_requirements_pin_torch_and_keep_runtime_dependencies_as_ranges():
    reqs = (ROOT / "requirements.txt").read_text()
    assert re.search(r"^torch==2\.13\.0$", reqs, re.M)
    assert re.search(r"^jupyter-book>=1\.0\.4,<2$", reqs, re.M)
    assert re.search(r"^-e \.$", reqs, re.M)
    pyproject = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"dependencies = \[(.*?)\]", pyproject, re.S).group(1)
    assert "==" not in deps and "torch>=" in deps


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_core_imports_nothing_of_the_lab():
    # posenc's top level (position methods, attention, KV cache, config reading, transformers interop)
    # is what an engineer imports; posenc.lab (the tiny LM, training, data, studies, book helpers) sits on it
    import ast

    core = [p for p in (ROOT / "code" / "posenc").rglob("*.py") if "lab" not in p.relative_to(ROOT / "code").parts]
    assert len(core) > 15
    for path in core:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "posenc.lab" or n.startswith("posenc.lab.") for n in names), (path, names)
    out = subprocess.run([sys.executable, "-c", "import sys, posenc, posenc.hf, posenc.rope, posenc.relative, "
                          "posenc.kv_cache; print(sorted(m for m in sys.modules if m.startswith('posenc.lab')))"],
                         cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
