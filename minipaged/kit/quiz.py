"""Interview drills answered by the code: ``minipaged quiz``.

What it teaches: how to answer the PagedAttention interview question (the seed's Q32, kept in
its Chinese wording beside an English one), its follow-ups and pitfalls, and a dozen more
questions a strong interviewer asks, with every number in every answer computed now by the
package: the KV calculator and cost model (``minipaged/sim/``), the simulator, the block
managers and the attention code. Each answer lists the commands that reproduce its numbers,
and where the seed's own answer is wrong it says so, with the measured figure.

    minipaged quiz                 interactive in a terminal: a key reveals each answer
    minipaged quiz --answers       every question with its answer (never waits)
    minipaged quiz --only 3        one drill;  --list  the questions;  --glossary  the terms

When stdout is not a terminal and ``--answers`` is not given, the questions are printed as a
worksheet and nothing waits for a key. The drills themselves live in ``minipaged/drills.py``;
the terms in ``minipaged/glossary.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """An answer: short prose, the figures measured for it, and how to reproduce them."""

    text: str
    figures: list[tuple[str, str]] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    verdicts: list[tuple[str, str, str]] = field(default_factory=list)  # (claim, verdict, why)


@dataclass(frozen=True)
class Drill:
    key: str                 # short id, e.g. "seed", "follow-up-1", "why-16"
    source: str              # "seed question" | "seed follow-up 2" | "seed pitfall" | "interviewer"
    zh: str
    en: str
    answer: Callable[[Context], Answer]


class Context:
    """What the answers share: simulation size and seed, and a cache so that a simulation two
    drills need runs once."""

    def __init__(self, num_requests: int = 300, seed: int = 0) -> None:
        if num_requests < 1:
            raise ValueError(f"num_requests={num_requests} must be >= 1")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be an int >= 0 (the simulator's seed)")
        self.num_requests = num_requests
        self.seed = seed
        self._cache: dict[tuple, Any] = {}

    def sim(self, **kw: Any):
        """``minipaged.sim.simulator.simulate`` with this context's size and seed (cached)."""
        from minipaged.sim.simulator import SimConfig, simulate

        kw.setdefault("num_requests", self.num_requests)
        kw.setdefault("seed", self.seed)
        key = tuple(sorted(kw.items()))
        if key not in self._cache:
            self._cache[key] = simulate(SimConfig(**kw))
        return self._cache[key]

    def final_lens(self, workload: str = "sharegpt"):
        """Final lengths (prompt + output) of at least 1000 synthetic requests of a workload,
        int64 [N] (``minipaged.sim.workloads.synthetic``, this context's seed; cached)."""
        import numpy as np

        from minipaged.sim.workloads import synthetic

        key = ("final_lens", workload)
        if key not in self._cache:
            reqs = synthetic(workload, max(self.num_requests, 1000), seed=self.seed)
            self._cache[key] = np.array([r.prompt_len + r.output_len for r in reqs],
                                        dtype=np.int64)
        return self._cache[key]

    def sim_command(self, **kw: Any) -> str:
        """The ``minipaged simulate`` command line that reproduces ``sim(**kw)``."""
        kw.setdefault("num_requests", self.num_requests)
        kw.setdefault("seed", self.seed)
        kw.setdefault("workload", "sharegpt")
        kw.setdefault("policy", "paged")
        order = ["workload", "policy", "num_requests", "seed", "block_size", "model",
                 "kv_cache_gb", "n", "beam_width", "preemption_mode"]
        parts = ["minipaged simulate"]
        for k in order + sorted(set(kw) - set(order)):
            if k in kw:
                flag = "--preemption" if k == "preemption_mode" else "--" + k.replace("_", "-")
                parts.append(f"{flag} {kw[k]}")
        return " ".join(parts)


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def nbytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# ---- rendering -------------------------------------------------------------------------------

VERDICT_STYLE = {"holds": "green", "off": "red", "unsupported": "yellow"}


def question_panel(i: int, total: int, d: Drill):
    from rich.panel import Panel
    from rich.text import Text

    body = Text()
    body.append(d.zh + "\n", style="bold")
    body.append(d.en)
    return Panel(body, title=Text(f"{i}/{total}  [{d.key}]  {d.source}"), title_align="left",
                 border_style="cyan")


def answer_renderable(a: Answer):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list = [Text(a.text)]
    if a.figures:
        t = Table(title="measured now", title_justify="left", show_header=False)
        t.add_column("figure")
        t.add_column("value", justify="right")
        for label, value in a.figures:
            t.add_row(label, value)
        parts.append(t)
    for claim, verdict, why in a.verdicts:
        line = Text("seed: ", style="bold")
        line.append(f"\u201c{claim}\u201d ")
        line.append(f"[{verdict.upper()}]", style=f"bold {VERDICT_STYLE.get(verdict, '')}")
        line.append(f" {why}")
        parts.append(line)
    if a.commands:
        parts.append(Text("reproduce: " + "\n           ".join(a.commands), style="dim"))
    return Group(*parts)


def decode_key(raw: str) -> str:
    """What one key press means: "right" / "left" for the arrow keys (whose escape sequences
    ESC [ C / ESC [ D arrive together in one read), else the first character, lowercased; an
    empty read (end of input) means "q"."""
    if raw.startswith("\x1b[") or raw.startswith("\x1bO"):
        return {"C": "right", "D": "left"}.get(raw[2:3], "other")
    return raw[:1].lower() if raw else "q"


def _wait_key(prompt: str) -> str:
    """One key press (no Enter needed on Unix terminals), as ``decode_key`` names it."""
    sys.stdout.write(prompt)
    sys.stdout.flush()
    try:
        import os
        import termios
        import tty

        fd = sys.stdin.fileno()
        old = termios.tcgetattr(fd)
        try:
            tty.setcbreak(fd)
            # One raw read takes a whole escape sequence (an arrow key is three bytes), so its
            # tail is not left behind to be read as two more key presses.
            raw = os.read(fd, 8).decode(errors="replace")
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, old)
    except (ImportError, OSError, ValueError):
        raw = (sys.stdin.readline() or "q")[:1]
    sys.stdout.write("\n")
    return decode_key(raw)


def run_quiz(drills: list[Drill], ctx: Context, *, answers: bool, interactive: bool,
             console=None) -> int:
    from rich.console import Console

    console = console or Console()
    total = len(drills)
    for i, d in enumerate(drills, 1):
        console.print(question_panel(i, total, d))
        if interactive and not answers:
            if _wait_key("think, then press a key to reveal (q quits) ") == "q":
                return 0
        if answers or interactive:
            with console.status("measuring..."):
                a = d.answer(ctx)
            console.print(answer_renderable(a))
            console.print()
            if interactive and not answers and i < total:
                if _wait_key("press a key for the next question (q quits) ") == "q":
                    return 0
    if not answers and not interactive:
        console.print("Answers: minipaged quiz --answers (every number is measured as it "
                      "prints).")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "quiz", help="interview drills on PagedAttention, answered with live numbers",
        description=(
            "Interview drills: the seed question (Chinese and English), its follow-ups and\n"
            "pitfalls, and more questions a strong interviewer asks. Every number in an answer\n"
            "is computed as it prints, by the calculator, the simulator and the managers, with\n"
            "the command that reproduces it. Where the seed answer is wrong, the drill says so.\n\n"
            "  minipaged quiz                 interactive: a key reveals each answer\n"
            "  minipaged quiz --answers       print every question and answer\n"
            "  minipaged quiz --only why-16   one drill (key or number)\n"
            "  minipaged quiz --glossary      every key term in English and Chinese\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--answers", action="store_true", help="print every answer, never wait")
    p.add_argument("--only", action="append", metavar="KEY|N",
                   help="only this drill (repeatable)")
    p.add_argument("--list", action="store_true", help="list the drills and exit")
    p.add_argument("--glossary", action="store_true", help="print the glossary and exit")
    p.add_argument("--num-requests", type=int, default=300,
                   help="requests per simulation behind the answers (default 300)")
    p.add_argument("--seed", type=int, default=0, help="simulation seed (default 0)")
    p.set_defaults(func=_run)


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
            raise ValueError(f"--only {o!r} names no drill; expected 1..{len(drills)} or one "
                             f"of {', '.join(keys)}")
    return out


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from minipaged.kit.drills import DRILLS
    from minipaged.kit.glossary import glossary_table

    console = Console()
    if args.glossary:
        console.print(glossary_table())
        return 0
    if args.list:
        t = Table(title="interview drills (minipaged quiz --only KEY)")
        for col in ("#", "key", "source", "question"):
            t.add_column(col)
        for i, d in enumerate(DRILLS, 1):
            t.add_row(str(i), d.key, d.source, f"{d.zh}\n{d.en}")
        console.print(t)
        return 0
    try:
        drills = select(list(DRILLS), args.only)
        ctx = Context(args.num_requests, args.seed)
    except ValueError as e:
        console.print(f"[red]minipaged quiz:[/] {e}")
        return 2
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    return run_quiz(drills, ctx, answers=args.answers, interactive=interactive, console=console)
