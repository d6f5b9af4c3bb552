"""Bad command lines: each one gets one clear line on stderr and exit status 2, never a traceback.

A fixed table of bad inputs for every command, each with the fragment of the message it must
print (which names the argument, the value and what was expected), one table per family of
commands: test_cli_teaching_errors.py (demo, check, quiz, present), test_cli_sim_errors.py
(kv-calc, simulate, experiment, factcheck), test_cli_measure_errors.py (bench, gpu-check),
test_cli_model_errors.py (generate, train), and this file's: the command itself and a rule all
of them share (an empty path is not the current directory). Here too: the tables together try
every command, and a closed output pipe, MINIPAGED_TRACEBACK=1 and --help. How each line runs
and what it must print is in cli_helpers.py. The tables grow with every command and every bad
input found.

Left out, until the scheduler fix for them lands: the pool sizes on which ``generate`` and
``simulate`` with ``--preemption swap`` never finish (a swapped group that can never come
back), e.g. ``generate ... --n 3 --num-blocks 3 --block-size 32 --preemption swap``.
"""

from __future__ import annotations

import os

import pytest
import test_cli_measure_errors
import test_cli_model_errors
import test_cli_sim_errors
import test_cli_teaching_errors
from cli_helpers import check_one_clear_line, ids, run_cli, run_table

# (command line after `minipaged`, a fragment its error message must contain). {name} is a file
# made by cli_helpers.run_table.
CASES: list[tuple[str, str]] = [
    # the command itself
    ("", "the following arguments are required: COMMAND"),
    ("nope", "invalid choice: 'nope'"),
    ("demo --bogus", "minipaged demo: unrecognized arguments: --bogus"),
    ("bench attention --bogus 1", "minipaged bench attention: unrecognized arguments: --bogus 1"),
    # an empty path is not the current directory
    ("simulate --json ''", "--json='' is empty; expected a path"),
    ("simulate --workload ''", "--workload='' is empty; expected a path"),
    ("generate x --checkpoint ''", "--checkpoint='' is empty; expected a path"),
    ("train --out ''", "--out='' is empty; expected a path"),
    ("train --out {dir}/x.json", "ends in .json, the name its report is written to; expected "
                                 "another suffix (.pt)"),
    ("kv-calc --entry-bytes 1", "--entry-bytes=1 names at most 128 blocks (signed entries), and "
                                "this cache has 983; expected a larger --entry-bytes"),
    ("present ''", "deck='' is empty; expected a path"),
    ("demo paging --svg ''", "--svg='' is empty; expected a path"),
    ("gpu-check --out ''", "--out='' is empty; expected a path"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_table(CASES, tmp_path_factory)


@pytest.mark.parametrize("line, fragment", CASES, ids=ids(CASES))
def test_bad_input_is_one_clear_line(results, line, fragment):
    check_one_clear_line(results, line, fragment, CASES)


TABLES = (CASES, test_cli_teaching_errors.CASES, test_cli_sim_errors.CASES,
          test_cli_measure_errors.CASES, test_cli_model_errors.CASES)


def test_the_table_covers_every_command():
    from minipaged.kit.cli import build_parser

    cases = [case for table in TABLES for case in table]
    commands = {line.split()[0] for line, _ in cases if line}
    names = set(build_parser()._subparsers._group_actions[0].choices)
    assert names <= commands, f"no bad input tried for {names - commands}"
    assert len(cases) >= 80 and len({line for line, _ in cases}) == len(cases)


@pytest.mark.parametrize("argv", [["kv-calc"], ["quiz", "--list"], ["demo", "paging"]])
def test_a_closed_pipe_is_one_line_too(argv):
    """`minipaged ... | head` once head has quit: stdout's reader is gone before the output."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = run_cli(argv, stdout=write)
    finally:
        os.close(write)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"minipaged {argv[0]}: the output pipe closed before the output ended"]


def test_minipaged_traceback_shows_the_traceback():
    out = run_cli(["quiz", "--only", "nope"], env={"MINIPAGED_TRACEBACK": "1"})
    assert out.returncode == 1 and "Traceback" in out.stderr and "names no drill" in out.stderr


def test_help_shows_defaults_and_no_notes_for_code_readers():
    for argv in (["--help"], ["simulate", "--help"], ["kv-calc", "--help"],
                 ["factcheck", "--help"], ["present", "--help"], ["bench", "kernel", "--help"],
                 ["bench", "attention", "--help"], ["generate", "--help"], ["train", "--help"]):
        out = run_cli(argv)
        text = " ".join(out.stdout.split())
        assert out.returncode == 0, argv
        for leak in ("Read next", "Read before", "What it teaches", "What this teaches",
                     "issue ", "shared/"):
            assert leak not in text, (argv, leak)
        if argv != ["--help"]:
            assert "(default: " in text, argv
