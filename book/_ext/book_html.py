"""Sphinx extension: the HTML book works offline and loads without errors.

1. **MathJax from the build, not a CDN.** The book is read from disk on machines with no network,
   where a MathJax loaded from a CDN never arrives and every equation stays raw TeX. This copies
   MathJax 3 from the ``django-static-mathjax`` package (PyPI; MathJax's own release files,
   Apache-2.0) into ``_static/mathjax/`` of the HTML build. ``mathjax_path`` in ``_config.yml`` names
   the component to load, relative to ``_static``; the SVG output is used because it needs no web
   fonts, which browsers refuse to load from ``file://`` pages.
2. **Each inline script once.** sphinx-thebe registers its configuration script (``const
   THEBE_JS_URL = ...``) every time documents are read, and a page that declares a ``const`` twice
   raises a SyntaxError in the reader's console; identical scripts are dropped from each page.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sphinx.errors import ExtensionError

PREFIX = "mathjax/"
# What a single combined component loads later, on demand: the menu, accessibility (and the
# speech rule engine it uses), input extensions and output modules.
LAZY_DIRS = ("a11y", "adaptors", "input", "output", "sre", "ui")


def mathjax_release() -> Path:
    """The ``es5`` folder of the MathJax release installed by ``django-static-mathjax``."""
    try:
        import mathjax  # the import name of django-static-mathjax
    except ImportError as exc:
        raise ExtensionError(
            "book_html: the package 'django-static-mathjax' is not installed "
            "(pip install -r requirements.txt)"
        ) from exc
    release = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not release.is_dir():
        raise ExtensionError(f"book_html: no MathJax release at {release}")
    return release


def check_config(app, config) -> None:
    path = config.mathjax_path
    if not (isinstance(path, str) and path.startswith(PREFIX) and "//" not in path):
        raise ExtensionError(
            f"book_html: mathjax_path must be a path under {PREFIX!r} in _static, got {path!r}"
        )
    component = mathjax_release() / path[len(PREFIX):]
    if not component.is_file():
        raise ExtensionError(f"book_html: mathjax_path={path!r} names no file of the release ({component})")


def copy_mathjax(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    release = mathjax_release()
    target = Path(app.outdir) / "_static" / "mathjax"
    component = app.config.mathjax_path[len(PREFIX):]
    (target / component).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(release / component, target / component)
    for name in LAZY_DIRS:
        shutil.copytree(release / name, target / name, dirs_exist_ok=True)
    shutil.copy2(release.parent / "LICENSE", target / "LICENSE")


def drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        # an inline script is registered with filename None once and '' once: the same script
        filename = getattr(script, "filename", script) or ""
        attributes = tuple(sorted((k, str(v)) for k, v in getattr(script, "attributes", {}).items()))
        key = (str(filename), getattr(script, "priority", None), attributes)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("config-inited", check_config)
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)  # after every theme handler
    app.connect("build-finished", copy_mathjax)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
