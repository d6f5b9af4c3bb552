"""Hidden tests for ``exercises/`` and the ``minipaged check PATH|NUMBER`` command.

What it teaches: how to check your own PagedAttention pieces. Each exercise file in
``exercises/`` holds functions that raise ``NotImplementedError``; a learner fills them in and
runs ``minipaged check 6`` (or ``minipaged check path/to/my_copy.py``: any path works, the
file's ``EXERCISE = "NN_name"`` line says which exercise it is). The cases live here, inside the
package, so a learner never sees them while working; they compare against the package's own
oracles (``dense_attention``, ``reshape_and_cache``, ...) where those exist, and against plain
NumPy references otherwise.

The exercises, in course order (lesson numbers in brackets):

    01_kv_bytes            bytes of KV per token, token slots and blocks on a GPU       [01]
    02_contiguous_waste    reservation policies and the paper's four waste categories   [02]
    03_block_allocator     a free list with reference counts                            [03]
    04_block_table         block tables, slot mapping, padded tables                    [03]
    05_reshape_and_cache   scatter new tokens' K/V into the pages                       [03]
    06_paged_gather        paged attention by gathering through the block table         [03]
    07_online_softmax      paged attention block by block with the online softmax       [03, 08]
    08_copy_on_write       fork and copy-on-write append                                [04]
    09_beam_search         beam search: fork the survivors, free the dropped beams      [04]
    10_prefix_cache        chained block hashes and an LRU free queue                   [05]
    11_preemption          which groups to preempt, swap or recompute                   [06]
    12_flashinfer_csr      padded block table <-> FlashInfer's CSR page table           [07]
    13_two_level_table     a two-level block table for very long contexts               [07]

Read next: ``exercises/README.md``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from minipaged.kit.grader.core import (
    CaseFailure,
    Exercise,
    GradeResult,
    exercise_name_in,
    expect,
    grade,
)

# Modules holding the hidden cases; each defines one or more ``Exercise`` objects named EX_*.
CASE_MODULES = (
    "minipaged.kit.grader.ex_memory",
    "minipaged.kit.grader.ex_blocks",
    "minipaged.kit.grader.ex_attention",
    "minipaged.kit.grader.ex_sharing",
    "minipaged.kit.grader.ex_scheduling",
    "minipaged.kit.grader.ex_formats",
)

__all__ = ["CaseFailure", "Exercise", "GradeResult", "all_exercises", "exercises_dir",
           "expect", "grade", "resolve"]


def all_exercises() -> dict[str, Exercise]:
    """Every exercise by name ("01_kv_bytes", ...), in course order."""
    found: dict[str, Exercise] = {}
    for modname in CASE_MODULES:
        mod = importlib.import_module(modname)
        for value in vars(mod).values():
            if isinstance(value, Exercise):
                found[value.name] = value
    return dict(sorted(found.items()))


def exercises_dir() -> Path:
    """``./exercises`` when run from a checkout's root, else the one beside the package."""
    here = Path.cwd() / "exercises"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parents[3] / "exercises"


def resolve(spec: str, *, solution: bool = False) -> tuple[Exercise, Path]:
    """Turn ``"6"``, ``"06"``, ``"06_paged_gather"`` or a file path into (exercise, file).

    Raises ValueError with the list of exercises when ``spec`` names none of them."""
    exercises = all_exercises()
    path = Path(spec)
    if path.suffix == ".py" or path.exists():
        if not path.is_file():
            raise ValueError(f"exercise file {spec!r} does not exist")
        name = exercise_name_in(path) or path.stem
        if name not in exercises:
            raise ValueError(
                f"{spec!r} has no EXERCISE = \"NN_name\" line and its file name matches no "
                f"exercise; expected one of {', '.join(exercises)}")
        return exercises[name], path
    number = spec.split("_", 1)[0]
    if not number.isdigit():
        raise ValueError(f"exercise {spec!r} is neither a number nor a .py file; "
                         f"expected one of {', '.join(exercises)}")
    matches = [e for e in exercises.values() if e.number == int(number)]
    if not matches:
        raise ValueError(f"there is no exercise {spec!r}; expected one of "
                         f"{', '.join(exercises)}")
    ex = matches[0]
    folder = exercises_dir() / "solutions" if solution else exercises_dir()
    file = folder / f"{ex.name}.py"
    if not file.is_file():
        raise ValueError(f"exercise {ex.name} should be at {file}, which does not exist; "
                         f"pass the path of your copy instead")
    return ex, file
