"""Hidden tests for ``exercises/`` and the ``minipaged check PATH|NUMBER`` command.

What it teaches: how to check your own PagedAttention pieces. Each exercise file in
``exercises/`` holds functions that raise ``NotImplementedError``; a learner fills them in and
runs ``minipaged check 6`` (or ``minipaged check path/to/my_copy.py``: any path works, the
file's ``EXERCISE = "NN_name"`` line says which exercise it is). The cases live here, inside the
package, so a learner never sees them while working; they compare against the package's own
oracles (``dense_attention``, ``reshape_and_cache``, ...) and against plain references written
again from each exercise's rules. ``exercises/README.md`` lists the exercises.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from minipaged.kit.grader.core import Exercise, exercise_name_in, grade

# Modules holding the hidden cases; each defines one or more ``Exercise`` objects named EX_*.
CASE_MODULES = ("ex_memory", "ex_blocks", "ex_attention", "ex_sharing", "ex_scheduling",
                "ex_formats", "ex_chunked")

__all__ = ["all_exercises", "exercises_dir", "grade", "register", "resolve"]


def all_exercises() -> dict[str, Exercise]:
    """Every exercise by name ("01_kv_bytes", ...), in course order."""
    found = {}
    for name in CASE_MODULES:
        for value in vars(importlib.import_module(f"minipaged.kit.grader.{name}")).values():
            if isinstance(value, Exercise):
                found[value.name] = value
    return dict(sorted(found.items()))


def exercises_dir() -> Path:
    """``./exercises`` when run from a checkout's root, else the one beside the package."""
    here = Path.cwd() / "exercises"
    return here if here.is_dir() else Path(__file__).resolve().parents[3] / "exercises"


def resolve(spec: str, *, solution: bool = False) -> tuple[Exercise, Path]:
    """Turn ``"6"``, ``"06"``, ``"06_paged_gather"`` or a file path into (exercise, file).

    Raises ValueError with the list of exercises when ``spec`` names none of them."""
    exercises = all_exercises()
    known = ", ".join(exercises)
    path = Path(spec)
    if path.suffix == ".py" or path.exists():
        if not path.is_file():
            raise ValueError(f"exercise file {spec!r} does not exist")
        name = exercise_name_in(path) or path.stem
        if name not in exercises:
            raise ValueError(f"{spec!r} has no EXERCISE = \"NN_name\" line and its file name "
                             f"matches no exercise; expected one of {known}")
        return exercises[name], path
    number = spec.split("_", 1)[0]
    if not number.isdigit():
        raise ValueError(f"exercise {spec!r} is neither a number nor a .py file; "
                         f"expected one of {known}")
    matches = [e for e in exercises.values() if e.number == int(number)]
    if not matches:
        raise ValueError(f"there is no exercise {spec!r}; expected one of {known}")
    file = exercises_dir() / ("solutions" if solution else "") / f"{matches[0].name}.py"
    if not file.is_file():
        raise ValueError(f"exercise {matches[0].name} should be at {file}, which does not "
                         f"exist; pass the path of your copy instead")
    return matches[0], file


HELP = """\
Grade your answer to an exercise with hidden tests.

  minipaged check 6                      grades exercises/06_paged_gather.py
  minipaged check ~/work/my_gather.py    grades a copy anywhere (its EXERCISE line says which)
  minipaged check --list                 lists the exercises
  minipaged check 6 --solution           grades the reference solution (a spoiler)

Prints which cases pass, the first failing case with its inputs, expected and actual values,
and a hint. Exits 0 when every case passes, 1 otherwise, 2 when the argument names nothing.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check", help="grade an exercise with hidden tests",
                              description=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("exercise", nargs="?", metavar="PATH|NUMBER",
                   help="an exercise number (1-14) or the path of your file")
    p.add_argument("--list", action="store_true", help="list the exercises and exit")
    p.add_argument("--solution", action="store_true",
                   help="grade exercises/solutions/NN_*.py instead (spoiler)")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="seconds one case may run before it is stopped, so an endless loop "
                        "is reported instead of hanging (default 20; 0 = no limit)")
    p.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from minipaged.kit.grader.report import print_report

    console = Console()
    if args.list or not args.exercise:
        table = Table(title="exercises (minipaged check NUMBER)")
        table.add_column("#", justify="right")
        table.add_column("file")
        table.add_column("topic")
        table.add_column("cases", justify="right")
        for ex in all_exercises().values():
            table.add_row(str(ex.number), f"exercises/{ex.name}.py", ex.title, str(len(ex.cases)))
        console.print(table)
        return 0 if args.list else 2
    try:
        if not args.timeout >= 0:
            raise ValueError(f"--timeout={args.timeout} must be >= 0 seconds (0 = no limit)")
        exercise, path = resolve(args.exercise, solution=args.solution)
    except ValueError as e:
        Console(stderr=True).print(f"[red]minipaged check:[/] {e}", highlight=False)
        return 2
    result = grade(exercise, path, timeout_s=args.timeout)
    print_report(result, console)
    return 0 if result.passed else 1
