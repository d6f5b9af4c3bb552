"""The ``minipaged`` command line: every subcommand, its arguments, and one error style.

This package owns the whole command line (the core, ``sim/`` and ``model/`` only expose plain
functions). Each family of commands is one module, holding for each command its ``--help``
text, its parser (``add_NAME``) and its runner (what it does with the parsed arguments):

    teaching.py    demo, check, quiz, present        the classroom: pictures, exercises, drills
    kv_calc.py     kv-calc                           KV cache arithmetic
    simulation.py  simulate, experiment, factcheck   the serving simulator
    measure.py     bench, gpu-check                  speed, and the CUDA kernels on a GPU
    generation.py  generate                          the tiny model (or a Hugging Face one);
                                                     its refusals: generation_checks.py
    training.py    train                             retraining the tiny model

``args.py`` holds what every parser is built with (checked numbers and paths, the help layout),
``common.py`` what the runners share (errors, flags that would go unused, memory limits, progress
bar, tables, JSON). This module puts the commands together, in the order of the course, and runs
one command line. Heavy imports (torch, CuPy, the simulator) happen inside the runners, so
``--help`` is instant.

One error style: bad input, found by the parser or by the code it calls (a ValueError, a missing
file, a size that does not fit in memory, a closed pipe ...), prints one line,
``minipaged CMD: message``, on stderr and exits with status 2; never a traceback. A check that
fails exits with 1, and a command that needs a GPU and finds none (``gpu-check``, ``bench
kernel``) says so and exits with 3: nothing ran.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from minipaged.kit.cli import generation, kv_calc, measure, simulation, teaching, training
from minipaged.kit.cli.args import Formatter, Parser
from minipaged.kit.cli.common import describe, user_errors

DESCRIPTION = """\
minipaged: vLLM's PagedAttention from scratch, in NumPy (and CUDA, and a tiny torch model).

Every number these commands print is measured by the package itself. Start with
`minipaged demo`, then read lessons/01_*.py onwards; `minipaged COMMAND --help` explains each
command. A bad argument gets one line on stderr and exit status 2 (set MINIPAGED_TRACEBACK=1
to see the Python traceback instead).
"""


COMMANDS = (teaching.add_demo, kv_calc.add_kv_calc, simulation.add_simulate,
            simulation.add_experiment, simulation.add_factcheck, measure.add_bench,
            generation.add_generate, training.add_train, teaching.add_check, teaching.add_quiz,
            teaching.add_present, measure.add_gpu_check)


def build_parser() -> Parser:
    parser = Parser(prog="minipaged", description=DESCRIPTION, formatter_class=Formatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; returns the exit status (0 ok, 1 a check failed, 2 bad input, 3 no
    GPU for a command that needs one: nothing ran)."""
    try:
        args, extra = build_parser().parse_known_args(argv)
    except SystemExit as e:             # --help (0) or an argument error, already printed (2)
        return e.code if isinstance(e.code, int) else 2
    if extra:  # argparse would name the top parser; the command's own prog says which one
        return _refuse(args.prog, f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:             # e.g. `minipaged quiz --answers | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _refuse(args.prog, "the output pipe closed before the output ended")
    except SystemExit as e:             # rich's consoles turn a closed pipe into exit(1)
        if isinstance(e.__context__, BrokenPipeError):
            return _refuse(args.prog, "the output pipe closed before the output ended")
        raise
    except Exception as e:
        if os.environ.get("MINIPAGED_TRACEBACK") or not isinstance(e, user_errors()):
            raise
        return _refuse(args.prog, describe(e))


def _refuse(prog: str, message: str) -> int:
    try:
        print(f"{prog}: {message}", file=sys.stderr)
    except OSError:                     # stderr is gone too: the exit status still says it
        pass
    return 2


if __name__ == "__main__":
    sys.exit(main())
