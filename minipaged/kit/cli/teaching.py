"""The teaching commands: ``demo``, ``check``, ``quiz`` and ``present``.

Their runners hand the parsed arguments to the classroom kit: the demo player (``kit/demo.py``),
the grader (``kit/grader/``), the interview drills (``kit/quiz/``) and the slide presenter
(``kit/present.py``, ``kit/figures.py``).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from minipaged import _checks
from minipaged.kit.cli.args import (
    NON_NEGATIVE,
    bounds,
    command,
    input_dir,
    input_file,
    num,
    output_dir,
    path,
    unset,
)
from minipaged.kit.cli.common import (
    check_sim_size,
    flag_words,
    reading,
    refuse_unused,
    table,
)

# ---- demo --------------------------------------------------------------------------------------

DEMO_HELP = """\
Watch a paged KV cache work, one step at a time. Scenes, in tour order:

  fragmentation  the same requests in a contiguous cache (max / pow2 / oracle reservations)
                 and in a paged cache, with the waste of each (vLLM paper Fig. 2)
  paging         block tables growing token by token; slot = block * block_size + offset
  fork           parallel sampling: forked sequences share blocks, copy-on-write on append
  beam           beam search: forking candidates and freeing dropped beams
  prefix         a shared system prompt: prefix-cache hits and LRU eviction
  cow-prefix     fork with the prefix cache on: full blocks shared by hash, the last one
                 by copy-on-write; a copy, once full, found by hash by another request
  preempt        a pool too small: swapping to a CPU pool and back, and recomputation
  attention      a query walking its block table; the output equals dense attention
  model          the tiny trained model generating through the paged engine: real text in
                 the blocks, two samples sharing the prompt, copy-on-write (needs torch)

Without SCENE, plays all scenes this checkout supports, in order (--list says which).
Keys: space or right arrow = next, a = autoplay on/off, q = quit. When stdout is not a
terminal the demo plays through without waiting and exits 0.
"""


def add_demo(sub) -> None:
    p = command(sub, "demo", "the classroom demo: live pictures of block tables, sharing and "
                "preemption", DEMO_HELP, demo)
    p.add_argument("scene", nargs="?", metavar="SCENE",
                   help="one scene to play (default: the whole tour); see the list above")
    num(p, "--seed", int, 0, "random seed of the requests (same seed, same pictures)",
        NON_NEGATIVE)
    num(p, "--width", int, None, "force the layout width in columns (60 to 500), e.g. for a "
        "projector", bounds(low=60, high=500))
    num(p, "--speed", float, 1.5, "seconds per frame when autoplaying",
        bounds(above=0, high=3600))
    p.add_argument("--autoplay", action="store_true", help="start in autoplay (a pauses)")
    path(p, "--svg", output_dir, "also write each frame as an SVG file into DIR", metavar="DIR")
    path(p, "--html", output_dir, "also write each frame as an HTML file into DIR",
         metavar="DIR")
    p.add_argument("--list", action="store_true",
                   help="list the scenes and whether this checkout can play them")
    p.set_defaults(not_listed=unset(p, "scene", "seed", "width", "speed", "autoplay", "svg",
                                    "html"))


def demo(args) -> int:
    from minipaged.kit import demo as player

    if args.list:
        refuse_unused(args, "--list lists the scenes and plays none", args.not_listed,
                      "--list alone")
    return player.run(args)


# ---- check -------------------------------------------------------------------------------------

CHECK_HELP = """\
Grade your answer to an exercise with hidden tests.

  minipaged check 6                      grades exercises/06_paged_gather.py
  minipaged check ~/work/my_gather.py    grades a copy anywhere (its EXERCISE line says which)
  minipaged check --list                 lists the exercises
  minipaged check 6 --solution           grades the reference solution (a spoiler)

Prints which cases pass, the first failing case with its inputs, expected and actual values,
and a hint. Exits 0 when every case passes, 1 otherwise, 2 when the argument names nothing.
"""


# The longest --timeout: kit.grader.core.MAX_TIMEOUT_S, which the parser cannot import without
# loading every exercise (tests/test_cli_teaching_errors.py checks that the two agree).
MAX_TIMEOUT_S = 86400


def add_check(sub) -> None:
    p = command(sub, "check", "grade an exercise with hidden tests", CHECK_HELP, check)
    p.add_argument("exercise", nargs="?", metavar="PATH|NUMBER",
                   help="an exercise number (1-14), its name (06_paged_gather) or the path of "
                        "your file")
    p.add_argument("--list", action="store_true", help="list the exercises and exit")
    p.add_argument("--solution", action="store_true",
                   help="with a number or a name: grade exercises/solutions/NN_*.py instead "
                        "(spoiler)")
    num(p, "--timeout", float, 20.0, "seconds the import or one case may run before it is "
        "stopped, so an endless loop is reported instead of hanging (0 = no limit)",
        bounds(low=0, high=MAX_TIMEOUT_S))
    p.set_defaults(not_listed=unset(p, "exercise", "solution", "timeout"))


def check(args) -> int:
    from minipaged.kit.grader import all_exercises, grade, resolve
    from minipaged.kit.grader.report import print_report

    console = Console()
    if args.list:
        refuse_unused(args, "--list lists the exercises and grades none", args.not_listed,
                      "--list alone")
    if args.list or args.exercise is None:
        t = table("exercises (minipaged check NUMBER)", ("#", "file", "topic", "cases"),
                  left=("file", "topic"))
        for ex in all_exercises().values():
            t.add_row(str(ex.number), f"exercises/{ex.name}.py", ex.title, str(len(ex.cases)))
        console.print(t)
        if args.list:
            return 0
        raise ValueError("name the exercise to grade: its number or name (above) or a path")
    with flag_words({"solution": "--solution"}):
        exercise, path = resolve(args.exercise, solution=args.solution)
    result = grade(exercise, path, timeout_s=args.timeout)
    print_report(result, console)
    return 0 if result.passed else 1


# ---- quiz --------------------------------------------------------------------------------------

QUIZ_HELP = """\
Interview drills: the interview answer's question (Chinese and English), its follow-ups and
pitfalls, and more questions a strong interviewer asks. Every number in an answer is computed
as it prints, by the calculator, the simulator and the managers, with the command that
reproduces it; where the interview answer is wrong, the drill says so (the same verdict as
`minipaged factcheck`). When stdout is not a terminal and --answers is not given, the
questions are printed as a worksheet and nothing waits for a key.

  minipaged quiz                 interactive: a key reveals each answer
  minipaged quiz --answers       print every question and answer
  minipaged quiz --only why-16   one drill (key or number)
  minipaged quiz --glossary      every key term in English and Chinese
"""


def add_quiz(sub) -> None:
    p = command(sub, "quiz", "interview drills on PagedAttention, answered with live numbers",
                QUIZ_HELP, quiz)
    p.add_argument("--answers", action="store_true", help="print every answer, never wait")
    p.add_argument("--only", action="append", metavar="KEY|N",
                   help="only this drill (repeatable)")
    p.add_argument("--list", action="store_true", help="list the drills and exit")
    p.add_argument("--glossary", action="store_true", help="print the glossary and exit")
    num(p, "--num-requests", int, 300, "requests per simulation behind the answers")
    num(p, "--seed", int, 0, "simulation seed", NON_NEGATIVE)
    p.set_defaults(drill_options=unset(p, "list", "answers", "only", "num_requests", "seed"))


def quiz(args) -> int:
    from minipaged.kit import quiz
    from minipaged.kit.quiz.glossary import glossary_table

    console = Console()
    for flag, doing in (("glossary", "prints the glossary"), ("list", "lists the drills")):
        if getattr(args, flag):   # what either prints needs no drill, answer or simulation
            refuse_unused(args, f"--{flag} {doing} and runs no drill", {
                k: v for k, v in args.drill_options.items() if v[0] != flag}, f"--{flag} alone")
    if args.glossary:
        console.print(glossary_table())
        return 0
    if args.list:
        columns = ("#", "key", "source", "question")
        t = table("interview drills (minipaged quiz --only KEY)", columns, left=columns)
        for i, d in enumerate(quiz.DRILLS, 1):
            t.add_row(str(i), d.key, d.source, f"{d.zh}\n{d.en}")
        console.print(t)
        return 0
    drills = quiz.select(list(quiz.DRILLS), args.only)
    check_sim_size(args.num_requests, 4, flag="--num-requests")  # drills: beams of width 4
    ctx = quiz.Context(args.num_requests, args.seed)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    return quiz.run_quiz(drills, ctx, answers=args.answers, interactive=interactive,
                         console=console)


# ---- present -----------------------------------------------------------------------------------

PRESENT_HELP = """\
A terminal presenter for the Marp deck: it pages through the slides (Marp's front matter
skipped), shows each image as the plain-text twin of its SVG (slides/figures/NAME.txt), shows
speaker notes (HTML comments) with n, and plays a live demo scene where a slide says
<!-- demo: SCENE -->.

Keys in a terminal: space / right / enter = next, b / left = back, n = notes on/off,
d = play the slide's demo scene, q = quit. When stdout is not a terminal every slide is
printed once, nothing waits, exit 0.

    minipaged present slides/pagedattention.md
    minipaged present slides/pagedattention.md --notes --slide 12
    minipaged present --build-figures      regenerate slides/figures/ (demo + simulator)
    minipaged present --check-figures      exit 1 if a committed figure is stale
"""


def add_present(sub) -> None:
    p = command(sub, "present", "present the slide deck in the terminal; regenerate its "
                "figures", PRESENT_HELP, present)
    path(p, "deck", input_file, "the Marp deck to present", nargs="?", metavar="slides/NAME.md")
    p.add_argument("--notes", action="store_true", help="show speaker notes from the start")
    num(p, "--slide", int, 1, "start at this slide (1-based)")
    figs = p.add_mutually_exclusive_group()
    figs.add_argument("--build-figures", action="store_true",
                      help="regenerate every figure in slides/figures/ (demo frames + simulator)")
    figs.add_argument("--check-figures", action="store_true",
                      help="exit 1 when a committed figure differs from a fresh rendering")
    path(p, "--figures-dir", output_dir, "with --build-figures or --check-figures: where the "
         "figures live (unset: slides/figures)")


def present(args) -> int:
    from minipaged.kit import figures
    from minipaged.kit.present import present

    console = Console()
    on_figures = "--build-figures" if args.build_figures else "--check-figures" \
        if args.check_figures else None
    if on_figures is None and args.figures_dir is not None:
        raise ValueError(f"--figures-dir={args.figures_dir!r} goes with --build-figures or "
                         "--check-figures; a deck's figures are the files its images name")
    unused = [what for what, given in ((f"the deck {args.deck!r}", args.deck),
                                       ("--notes", args.notes), ("--slide", args.slide != 1))
              if given]
    if on_figures is not None:
        _checks.refuse_unused(f"{on_figures} works on the figures, not on a deck", unused,
                      f"{on_figures} alone (or with --figures-dir)")
    # a check compares with figures that must be there (a build makes its folder)
    if args.check_figures and args.figures_dir is not None \
            and (problem := input_dir(args.figures_dir)):
        raise ValueError(f"--figures-dir={args.figures_dir!r} {problem}")
    out = Path(args.figures_dir) if args.figures_dir else figures.default_dir()
    if args.build_figures:
        with console.status("drawing figures..."):
            made = figures.build(out)
        console.print(f"wrote {len(made)} figures (.svg + .txt) and manifest.json to {out}")
        return 0
    if args.check_figures:
        bad = list(figures.stale(out))
        if bad:   # the same folder: without --figures-dir the build would write slides/figures
            where = f" --figures-dir {shlex.quote(args.figures_dir)}" if args.figures_dir else ""
            console.print(f"[red]stale or missing figures:[/] {', '.join(bad)}\n"
                          f"regenerate with: minipaged present --build-figures{escape(where)}")
            return 1
        console.print("every figure is up to date")
        return 0
    if not args.deck:
        raise ValueError("name a deck, e.g. minipaged present slides/pagedattention.md")
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    with reading("deck", args.deck):
        return present(Path(args.deck), notes=args.notes, start=args.slide,
                       interactive=interactive, console=console)
