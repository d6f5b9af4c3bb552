"""The ``minipaged`` command line: one entry point, one subcommand per thing you can run.

Each subcommand lives in the module that teaches it; that module exposes
``register(subparsers)``, which adds its parser and sets ``func`` to the function that runs it.
Heavy imports (torch, cupy, the simulator) happen inside those functions, so ``minipaged --help``
stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Order here is the order in ``minipaged --help``: roughly the order of the course.
COMMAND_MODULES = (
    "minipaged.kit.demo",
    "minipaged.sim.memory",
    "minipaged.sim.commands",
    "minipaged.kit.factcheck",
    "minipaged.kit.bench",
    "minipaged.model.cli",
    "minipaged.kit.grader",
    "minipaged.kit.quiz",
    "minipaged.kit.present",
)

DESCRIPTION = """\
minipaged: PagedAttention from scratch, in NumPy (and CUDA, and a tiny torch model).

Every number these commands print is measured by the package itself. Start with
`minipaged demo`, then read lessons/01_*.py onwards. `minipaged COMMAND --help` explains
each command.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minipaged",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    gpu = sub.add_parser("gpu-check", help="with an NVIDIA GPU and CuPy: check every CUDA "
                         "kernel, probe its limits, measure its bandwidth, write a JSON report "
                         "(exit 3 without a GPU)")
    gpu.add_argument("--out", default="gpu-check.json", help="where to write the JSON report")
    gpu.set_defaults(func=_gpu_check)
    return parser


def _gpu_check(args: argparse.Namespace) -> int:
    from minipaged.cuda import gpu_check  # the command's logic lives with the kernels

    return gpu_check.main(["--out", args.out])


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
