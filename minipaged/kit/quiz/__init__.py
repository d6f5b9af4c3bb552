"""Interview drills answered by the code (``minipaged quiz``), and the fact-check behind them.

What it teaches: how to answer the PagedAttention interview question and more than twenty that a
strong interviewer asks, with every number in every answer computed as it prints by the
package (the calculator, cost model and simulator in ``minipaged/sim/``, the block managers,
the attention code). The package, in reading order:

    answer.py            the interview answer (a model answer the course fact-checks), as data
    context.py           one Context of measurements; pct, nbytes, Drill, Answer, Finding
    factcheck.py         every claim of the interview answer, measured, with one verdict
    drills_answer.py     the interview answer's question, follow-ups, pitfalls and claims
    drills_memory.py     interviewer drills: block size, capacity, GQA, traffic, preemption
    drills_mechanics.py  interviewer drills: kernel layout and grid, tables, sharing
    drills_engine.py     interviewer drills: vLLM v1's engine and pool, a token's KV bytes
    drills_systems.py    interviewer drills: speculation, windows, offloading, beams, critiques
    glossary.py          the course's vocabulary in English and Chinese

This module runs the drills: one at a time in a terminal (a key reveals each answer), all at
once with ``--answers``, or as a worksheet of questions when stdout is not a terminal.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from minipaged.kit.keys import decode_key, wait_key
from minipaged.kit.quiz import drills_answer, drills_mechanics, drills_memory, drills_systems
from minipaged.kit.quiz.context import VERDICTS, Answer, Context, Drill, nbytes, pct
from minipaged.sim import table

DRILLS: tuple[Drill, ...] = (drills_answer.DRILLS + drills_memory.DRILLS + drills_mechanics.DRILLS
                             + drills_systems.DRILLS)

__all__ = ["DRILLS", "Answer", "Context", "Drill", "answer_renderable", "decode_key", "nbytes",
           "pct", "run_quiz", "select", "wait_key"]


def select(drills: list[Drill], only: list[str] | None) -> list[Drill]:
    """Drills picked by key or 1-based number; ValueError naming an unknown one."""
    if not only:
        return drills
    keys = {d.key: d for d in drills}
    out = []
    for o in only:
        if o.isdigit() and 1 <= int(o) <= len(drills):
            out.append(drills[int(o) - 1])
        elif o in keys:
            out.append(keys[o])
        else:
            raise ValueError(f"--only={o!r} names no drill; expected 1..{len(drills)} or one "
                             f"of {', '.join(keys)}")
    return out


def question_panel(i: int, total: int, d: Drill) -> Panel:
    body = Text()
    body.append(d.zh + "\n", style="bold")
    body.append(d.en)
    return Panel(body, title=Text(f"{i}/{total}  [{d.key}]  {d.source}"), title_align="left",
                 border_style="cyan")


def answer_renderable(a: Answer) -> Group:
    parts: list = [Text(a.text)]
    if a.figures:
        t = table("measured now" + (f" ({a.run})" if a.run else ""), ("figure", "value"),
                  left=("figure",), title_justify="left", show_header=False)
        for label, value in a.figures:
            t.add_row(label, value)
        parts.append(t)
    for claim, verdict, why in a.verdicts:
        line = Text("the interview answer: ", style="bold")
        line.append(f"\u201c{claim}\u201d ")
        line.append(f"[{verdict.upper()}]", style=f"bold {VERDICTS[verdict]}")
        line.append(f" {why}")
        parts.append(line)
    if a.commands:
        parts.append(Text("reproduce: " + "\n           ".join(a.commands), style="dim"))
    return Group(*parts)


def run_quiz(drills: list[Drill], ctx: Context, *, answers: bool, interactive: bool,
             console: Console | None = None) -> int:
    console = console or Console()
    for i, d in enumerate(drills, 1):
        console.print(question_panel(i, len(drills), d))
        if interactive and not answers:
            if wait_key("think, then press a key to reveal (q quits) ") == "q":
                return 0
        if answers or interactive:
            with console.status("measuring..."):
                a = d.answer(ctx)
                a.run = a.run or ctx.label
            console.print(answer_renderable(a))
            console.print()
            if interactive and not answers and i < len(drills):
                if wait_key("press a key for the next question (q quits) ") == "q":
                    return 0
    if not answers and not interactive:
        console.print("Answers: minipaged quiz --answers (every number is measured as it "
                      "prints).")
    return 0
