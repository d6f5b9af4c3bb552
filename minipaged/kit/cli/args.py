"""The building blocks of every parser: the error style, the help layout, checked arguments.

A command's parser is written with four helpers: ``command`` adds a subcommand whose ``--help``
shows each option's default, ``num`` an int or float option checked as it is parsed, ``path`` a
file or directory that must exist (or be writable), and ``json_out`` the usual ``--json PATH``;
``unset`` records the unset values of options that a runner refuses where they would go unused.
A value that fails its check stops the parser with one line, ``minipaged CMD: --flag=VALUE
<what is wrong>``, and exit status 2.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path


class Parser(argparse.ArgumentParser):
    """argparse's own errors (an unknown option, a bad int) in the one error style."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default (flags and unset options excepted)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "%(default)" in text \
                or action.default == argparse.SUPPRESS:
            return text
        return text + " (default: %(default)s)"


class Checked(argparse.Action):
    """Store an argument after ``check(value)`` found nothing wrong; otherwise stop with
    ``minipaged CMD: --flag=VALUE <what check said>`` (each value of a list is checked)."""

    def __init__(self, *args, check: Callable[[object], str | None], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.check = check

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        for value in values if isinstance(values, list) else [values]:
            problem = None if value is None else self.check(value)  # None: an absent "?"
            if problem:
                parser.error(f"{option_string or self.dest}={value!r} {problem}")
        setattr(namespace, self.dest, values)


def bounds(*, low: float | None = None, above: float | None = None,
           high: float | None = None, finite: bool = True) -> Callable[[float], str | None]:
    """A check for a number: ``low <= v``, ``above < v``, ``v <= high``, finite unless told."""
    def check(v: float) -> str | None:
        rules = [f"{op} {x:g}" for op, x in ((">=", low), (">", above), ("<=", high))
                 if x is not None]
        if finite and not math.isfinite(v):
            return " ".join(["must be a finite number", *rules[:1]])
        ok = ((low is None or v >= low) and (above is None or v > above)
              and (high is None or v <= high))
        return None if ok else "must be " + " and ".join(rules)
    return check


# Path("") is Path("."): an empty argument would silently name the current directory.
EMPTY = "is empty; expected a path"


def input_dir(path: str) -> str | None:
    if not path:
        return EMPTY
    p = Path(path)
    if p.is_file():
        return "is a file; expected a directory"
    return None if p.is_dir() else "does not exist; expected an existing directory"


def input_file(path: str) -> str | None:
    if not path:
        return EMPTY
    p = Path(path)
    if p.is_dir():
        return "is a directory; expected a file"
    if p.exists() and not p.is_file():
        return "is not a regular file (a device, a pipe or a socket); expected a file"
    return None if p.is_file() else "does not exist; expected an existing file"


def output_file(path: str) -> str | None:
    if not path:
        return EMPTY
    p = Path(path)
    if p.is_dir():
        return "is a directory; expected a file name to write"
    if p.exists():  # written over at the end of the run: find out now that it can be
        try:
            with p.open("a"):
                pass
        except OSError as e:
            return f"cannot be written ({e.strerror or e})"
    parent = p.parent
    if not parent.is_dir():
        return f"is in a folder that does not exist ({str(parent)!r})"
    return None if os.access(parent, os.W_OK) else f"cannot be written (folder {str(parent)!r})"


def output_dir(path: str) -> str | None:
    if not path:
        return EMPTY
    p = Path(path)
    return "is a file; expected a directory" if p.exists() and not p.is_dir() else None


def workload(spec: str) -> str | None:
    from minipaged.sim.workloads import WORKLOADS

    if spec in WORKLOADS:
        return None
    problem = input_file(spec)
    return problem and f"{problem} (or one of {', '.join(sorted(WORKLOADS))})"


POSITIVE = bounds(low=1)          # counts and sizes
NON_NEGATIVE = bounds(low=0)      # seeds, offsets


def command(sub, name: str, help: str, description: str, runner, **kw) -> Parser:
    p = sub.add_parser(name, help=help, description=description, formatter_class=Formatter,
                       **kw)
    p.set_defaults(run=runner, prog=p.prog)
    return p


def num(p: Parser, flag: str, kind: type, default, help: str, check=POSITIVE, **kw) -> None:
    """An int or float option whose value is checked as it is parsed."""
    p.add_argument(flag, type=kind, default=default, help=help, action=Checked, check=check,
                   **kw)


def path(p: Parser, flag: str, check, help: str, **kw) -> None:
    p.add_argument(flag, help=help, action=Checked, check=check, **kw)


def unset(p: Parser, *dests: str) -> dict[str, tuple[str, object]]:
    """The arguments ``dests`` of ``p`` as flag (a positional's metavar) -> (dest, default): what
    ``common.refuse_unused`` compares the parsed values with."""
    return {(a.option_strings or [a.metavar])[0]: (a.dest, a.default)
            for a in p._actions if a.dest in dests}


def json_out(p: Parser, what: str) -> None:
    path(p, "--json", output_file, f"write {what} as JSON to PATH", metavar="PATH")
