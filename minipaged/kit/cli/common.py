"""What the runners share: which errors are the user's, memory limits, reading, output.

A runner checks what the parser cannot (sizes against the memory there is, files that must be
readable), then calls the package's plain functions and prints. A refusal is a ValueError
whose message names the argument, its value and what was expected; ``main`` prints it, as one
line, when ``user_errors`` counts its kind, described by ``describe``. The ``bench`` runners
(``minipaged/kit/bench/``) use the same memory checks, progress bar and tables. The memory
rule is ``minipaged/sim/host.py``'s, which ``simulate`` applies too; it is imported from here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from collections.abc import Mapping
from contextlib import contextmanager

from minipaged import _checks
from minipaged._checks import OutOfBlocksError
from minipaged._install import TORCH_HINT
from minipaged.sim import table as table
from minipaged.sim.host import SIM_BYTES_PER_BLOCK as SIM_BYTES_PER_BLOCK
from minipaged.sim.host import check_sim_size as check_sim_size
from minipaged.sim.host import refuse_if_too_big as refuse_if_too_big

# ---- errors and sizes --------------------------------------------------------------------------


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions bad input causes. Errors of the package's own kinds count too, when the
    module that defines them was imported (a module never imported raised nothing)."""
    kinds: list[type[BaseException]] = [ValueError, TypeError, OSError, ArithmeticError,
                                        RecursionError, MemoryError, OutOfBlocksError]
    for module, name in (("minipaged.model.runner", "BackendUnavailableError"),
                         ("minipaged.cuda.emu.cpu_build", "CompilerNotFoundError"),
                         ("minipaged.cuda.emu.cpu_build", "BuildError")):
        if module in sys.modules:
            kinds.append(getattr(sys.modules[module], name))
    return tuple(kinds)


def describe(e: BaseException, what: str = "") -> str:
    """One line for an error: its message, or what the error means when it has none. ``what``
    names the file being read (``--workload='w.jsonl'``, from ``reading``)."""
    if isinstance(e, UnicodeDecodeError):
        return (f"{what or 'a file'} is not UTF-8 text (byte {e.start}: {e.reason}); expected "
                "a text file")
    if isinstance(e, RecursionError):
        return f"{what or 'the input'} nests too deeply to be read"
    if isinstance(e, OSError) and what:
        return f"{what} cannot be read: {e.strerror or e}"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename!r}: {e.strerror}" if e.filename else e.strerror
    if isinstance(e, MemoryError):
        return f"out of memory {e}".strip()
    return " ".join(str(e).split()) or type(e).__name__


def in_flag_words(message: str, flags: Mapping[str, str]) -> str:
    """``message`` with each parameter in ``flags`` (name -> flag) written as its flag:
    ``block_size=32`` -> ``--block-size=32``, ``policy='paged'`` -> ``--policy=paged``,
    ``enable_prefix_caching=True`` -> ``--prefix-caching``, and a bare name with an underscore,
    ``block_size`` -> ``--block-size`` (a bare ``n`` or ``policy`` may be an ordinary word). So a
    check of ``SimConfig``, in its parameters' names, speaks the command line's words too."""
    def flag(m: re.Match) -> str:
        name, value = m.group(1) or m.group(3), (m.group(2) or "").strip("'")
        return flags[name] if value in ("", "True") else f"{flags[name]}={value}"

    names = "|".join(flags)
    bare = "|".join(name for name in flags if "_" in name) or "(?!)"    # (?!): matches nothing
    return re.sub(rf"\b(?:({names})=('[^']*'|[^\s,;:)]+)|({bare})\b)", flag, message)


@contextmanager
def flag_words(flags: Mapping[str, str], kinds: tuple[type[Exception], ...] = (ValueError,)):
    """A ValueError (or an error of ``kinds``) raised inside comes out ``in_flag_words``."""
    try:
        yield
    except kinds as e:
        raise ValueError(in_flag_words(str(e), flags)) from None


def refuse_unused(args, doing: str, options: Mapping[str, tuple[str, object]],
                  expected: str) -> None:
    """Refuse the options (flag, or a positional's name -> (dest, unset value), as
    ``kit.cli.args.unset`` makes them) that were given although what runs would not use them:
    ``{doing}: --flag=VALUE, --switch, NAME 'VALUE' would not be used; expected {expected}``
    (the values of a repeatable option repeat its flag)."""
    given = []
    for flag, (dest, unset) in options.items():
        if (value := getattr(args, dest)) != unset:
            given += [flag if v is True else f"{flag}={v}" if flag[0] == "-" else f"{flag} {v!r}"
                      for v in (value if isinstance(value, list) else [value])]
    _checks.refuse_unused(doing, given, expected)


def need_torch() -> None:
    """Refuse a command that needs torch, with the install hint, where torch is missing."""
    if importlib.util.find_spec("torch") is None:
        raise ValueError(TORCH_HINT)


@contextmanager
def reading(flag: str, value: str):
    """Errors while reading the file an argument named become one line naming the argument."""
    try:
        yield
    except (UnicodeDecodeError, RecursionError, OSError) as e:
        raise ValueError(describe(e, f"{flag}={value!r}")) from None


# ---- output helpers ----------------------------------------------------------------------------

def progress_bar(console, label: str):
    """A rich progress bar as a context manager yielding ``update(done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True, disable=not console.is_terminal) as prog:
            task = prog.add_task(label, total=None)
            yield lambda done, total: prog.update(task, completed=done, total=total)
    return bar()


def _jsonable(obj):
    """JSON objects have string keys (results keyed by block size or width), and strict JSON
    has no Infinity (an all-at-once request rate is written "inf")."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def write_json(console, path: str, obj) -> None:
    """``obj`` as JSON into ``path``, the value of ``--json`` (the parser checked its folder;
    a full disk is still found only here)."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_jsonable(obj), f, indent=2, sort_keys=True, default=str, allow_nan=False)
            f.write("\n")
    except OSError as e:
        raise ValueError(f"--json={path!r} cannot be written: {e.strerror or e}") from None
    console.print(f"wrote {path}")
