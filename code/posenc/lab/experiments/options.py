"""A configuration dataclass as command-line options, and back to the command that builds it.

A study's configuration is a frozen dataclass with a ``#:`` comment on every field (the
conventions' "dataclass configs with commented fields"). :func:`add_options` gives it one option
per field (``train_length`` -> ``--train-length``; a tuple takes several values, or none; a bool
is ``--name``/``--no-name``), with the comment as the help; :func:`from_args` reads the options
back over a base configuration, and :func:`command_for` writes the options that rebuild a
configuration. Nothing else is to be kept in sync when a field is added.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import shlex
import typing
from typing import Sequence


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment of each field of the dataclass ``cls`` (empty where the source is unavailable).

    Either form Sphinx reads: at the end of the field's line, or on the line just above it.
    """
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    above = dict((name, text) for text, name in re.findall(r"^    #: (.*)\n    (\w+): ", source, flags=re.M))
    return {**above, **dict(re.findall(r"^    (\w+): .*?#: (.*)$", source, flags=re.M))}


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add an option per field of the dataclass ``cls`` to ``parser``; every option defaults to ``None`` (not given).

    Field types: ``bool`` (``--name``/``--no-name``), ``tuple[T, ...]`` (zero or more values of
    type ``T``), ``T`` or ``Optional[T]`` for ``int``, ``float`` or ``str``.

    Raises:
        TypeError: if ``cls`` is not a dataclass.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"cls must be a dataclass, got {cls!r}")
    helps, hints = field_comments(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint, kw = hints[f.name], {"help": helps.get(f.name, ""), "default": None}
        if hint is bool:
            parser.add_argument(_option(f.name), action=argparse.BooleanOptionalAction, **kw)
        elif typing.get_origin(hint) is tuple:
            parser.add_argument(_option(f.name), nargs="*", type=typing.get_args(hint)[0], metavar=f.name.upper(), **kw)
        else:
            kind = next(t for t in (typing.get_args(hint) or (hint,)) if t is not type(None))
            parser.add_argument(_option(f.name), type=kind, metavar=f.name.upper(), **kw)


def from_args(base, args: argparse.Namespace):
    """``base`` (a dataclass instance) with every field that ``args`` gives replaced (lists become tuples).

    Raises:
        ValueError: from the dataclass's ``__post_init__``, for a bad value.
    """
    changes = {}
    for f in dataclasses.fields(base):
        value = getattr(args, f.name, None)
        if value is not None:
            changes[f.name] = tuple(value) if isinstance(value, list) else value
    return dataclasses.replace(base, **changes)


def command_for(config, prefix: Sequence[str]) -> str:
    """``prefix`` and the options that turn the default configuration into ``config`` (shell-quoted).

    Args:
        config: a dataclass instance whose class can be built with no arguments (the defaults).
        prefix: the command before the options, e.g. ``["python", "-m", "posenc.lab.experiments.extrapolation"]``.
    """
    default, args = type(config)(), list(prefix)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if value == getattr(default, f.name):
            continue
        if isinstance(value, bool):
            args.append(_option(f.name) if value else "--no-" + f.name.replace("_", "-"))
        else:
            args += [_option(f.name), *(str(v) for v in (value if isinstance(value, tuple) else (value,)))]
    return shlex.join(args)
