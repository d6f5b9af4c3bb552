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

import importlib
import re
from pathlib import Path

from minipaged.kit.grader.core import CaseFailure, Exercise, GradeResult, expect, grade

# Modules holding the hidden cases; each defines one or more ``Exercise`` objects named EX_*.
CASE_MODULES = ("ex_memory", "ex_blocks", "ex_attention", "ex_sharing", "ex_scheduling",
                "ex_formats", "ex_chunked")

__all__ = ["CaseFailure", "Exercise", "GradeResult", "all_exercises", "exercises_dir",
           "expect", "grade", "resolve"]


def all_exercises() -> dict[str, Exercise]:
    """Every exercise by name ("01_kv_bytes", ...), in course order."""
    found = {}
    for name in CASE_MODULES:
        for value in vars(importlib.import_module(f"minipaged.kit.grader.{name}")).values():
            if isinstance(value, Exercise):
                found[value.name] = value
    return dict(sorted(found.items()))


EXERCISE_MARK = re.compile(r'^EXERCISE\s*=\s*["\'](\d\d_[A-Za-z0-9_]+)["\']', re.MULTILINE)


def exercise_name_in(path: Path) -> str | None:
    """The ``EXERCISE = "NN_name"`` marker of a file (a copy under any name keeps it)."""
    try:
        m = EXERCISE_MARK.search(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    return m.group(1) if m else None


def exercises_dir() -> Path:
    """``./exercises`` when run from a checkout's root, else the one beside the package."""
    here = Path.cwd() / "exercises"
    return here if here.is_dir() else Path(__file__).resolve().parents[3] / "exercises"


def resolve(spec: str, *, solution: bool = False) -> tuple[Exercise, Path]:
    """Turn ``"6"``, ``"06"``, ``"06_paged_gather"`` or a file path into (exercise, file).

    Raises ValueError with the list of exercises when ``spec`` names none of them."""
    exercises = all_exercises()
    known = ", ".join(exercises)
    if not spec.strip():
        raise ValueError(f"exercise {spec!r} is empty; expected a number or a .py file")
    path = Path(spec)
    if path.suffix == ".py" or path.exists():
        if solution:
            raise ValueError(f"{spec!r} is a path, which solution=True would not use (it grades "
                             "the reference solution of an exercise named by its number or "
                             "name); expected a number or an exercise name, or the path alone")
        if path.is_dir():
            raise ValueError(f"exercise file {spec!r} is a directory; expected a .py file")
        if not path.is_file():
            raise ValueError(f"exercise file {spec!r} does not exist")
        try:  # an unreadable file is not one without an EXERCISE line
            path.open("rb").close()
        except OSError as e:
            raise ValueError(f"exercise file {spec!r} cannot be read: {e.strerror or e}") from None
        name = exercise_name_in(path) or path.stem
        if name not in exercises:
            raise ValueError(f"{spec!r} has no EXERCISE = \"NN_name\" line and its file name "
                             f"matches no exercise; expected one of {known}")
        return exercises[name], path
    number = spec.split("_", 1)[0]
    if not number.isdigit():
        raise ValueError(f"exercise {spec!r} is neither a number nor a .py file; "
                         f"expected one of {known}")
    matches = [e for e in exercises.values()   # "06_wrongname" is not exercise 6
               if spec == e.name or (spec == number and e.number == int(number))]
    if not matches:
        raise ValueError(f"there is no exercise {spec!r}; expected one of {known}")
    file = exercises_dir() / ("solutions" if solution else "") / f"{matches[0].name}.py"
    if not file.is_file():
        raise ValueError(f"exercise {matches[0].name} should be at {file}, which does not exist; "
                         f"pass the path of your copy instead")
    return matches[0], file
