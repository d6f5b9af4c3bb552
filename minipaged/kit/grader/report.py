"""Print a grading result in rich: a table of cases, the first failure in full, and its hint.

Every status has a word and a glyph as well as a colour, so the report reads the same on a
monochrome projector or with ``NO_COLOR`` set.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console, Group
from rich.panel import Panel
from rich.pretty import Pretty
from rich.table import Table
from rich.text import Text

from minipaged.kit.grader.core import GradeResult

STATUS = {
    "pass": ("✓ pass", "green"),
    "fail": ("✗ FAIL", "red"),
    "error": ("! ERROR", "red"),
    "timeout": ("⧖ TIMEOUT", "red"),
    "todo": ("… todo", "yellow"),
}


def _show(value: object):
    """Small arrays in full, big ones summarised; a dict one line per entry."""
    if isinstance(value, np.ndarray):
        with np.printoptions(precision=6, threshold=80, edgeitems=4, linewidth=90):
            return Text(f"array shape={value.shape} dtype={value.dtype}\n"
                        f"{np.array2string(value)}")
    if isinstance(value, dict):
        rows = []
        for k, v in value.items():
            if not isinstance(v, (np.ndarray, dict)) and len(repr(v)) < 70:
                rows.append(Text.assemble((f"{k} = ", "bold"), repr(v)))
            else:
                rows.append(Group(Text(f"{k} =", style="bold"), _show(v)))
        return Group(*rows)
    return Pretty(value, max_length=40, max_string=400)


def print_report(result: GradeResult, console: Console | None = None) -> None:
    console = console or Console()
    ex = result.exercise
    console.rule(Text(f"exercise {ex.name}: {ex.title}", style="bold"))
    console.print(Text(f"file: {result.path}"))
    if result.load_error:
        console.print(Panel(Text(result.load_error), title="could not load the file",
                            border_style="red"))
        console.print("Fix that, then run the check again.")
        return
    if result.untouched:
        names = ", ".join(f"{f}()" for f in ex.functions)
        console.print(Panel(Text(
            f"Not started yet: every case reached `raise NotImplementedError`.\n"
            f"Open {result.path} and write {names}.\n"
            f"Each docstring states the task, the shapes, the invariants and a hint.\n"
            f"Then run: minipaged check {result.path}"),
            title="… nothing to grade yet", border_style="yellow"))
        return

    table = Table(show_header=True, header_style="bold", expand=False)
    for col in ("#", "case", "result", "detail"):
        table.add_column(col, justify="right" if col == "#" else "left",
                         overflow="fold", max_width=60 if col == "detail" else None)
    for i, r in enumerate(result.results, 1):
        word, colour = STATUS[r.status]
        table.add_row(str(i), Text(r.name), Text(word, style=colour), Text(r.detail))
    console.print(table)
    total = len(result.results)
    if result.passed:
        console.print(f"[green bold]✓ all {total} cases pass.[/] Compare with "
                      f"exercises/solutions/{ex.name}.py (spoiler) when you are ready.")
        return

    first = next(r for r in result.results if r.status != "pass")
    parts: list = [Text(f"{first.name}: {first.detail}", style="bold")]
    if first.where:
        parts.append(Text(first.where))
    f = first.failure
    if f is not None:
        for label, value in (("inputs", f.inputs), ("expected", f.expected), ("got", f.got)):
            if value is not None:
                parts += [Text(f"\n{label}:", style="bold underline"), _show(value)]
    console.print(Panel(Group(*parts), title="first case that does not pass",
                        border_style="red"))
    if first.hint:
        console.print(Text.assemble(("hint: ", "bold"), first.hint))
    console.print(f"{sum(r.status == 'pass' for r in result.results)}/{total} cases pass.")
