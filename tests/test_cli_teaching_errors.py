"""Bad command lines of the classroom commands (demo, check, quiz, present): each one gets one
clear line on stderr and exit status 2, never a traceback (scenes, drills and exercises that do
not exist, widths, speeds and timeouts out of range, decks that are not one, figure folders that
are not folders). And the grader behind ``check`` under a learner's file that exits, loops
forever or outlives a timeout too short for its import: a result (exit status 1), never a
traceback, nor status 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import BIG, check_one_clear_line, ids, run_cli, run_table

DECK = "slides/pagedattention.md"

# (command line after `minipaged`, a fragment its error message must contain). {name} is a file
# made by cli_helpers.run_table.
CASES: list[tuple[str, str]] = [
    # demo
    ("demo nope", "scene='nope' is not a scene"),
    ("demo --width 20", "--width=20 must be >= 60 and <= 500"),
    ("demo --width 100000", "--width=100000 must be >= 60 and <= 500"),
    ("demo --width abc", "argument --width: invalid int value: 'abc'"),
    ("demo --speed 0", "--speed=0.0 must be > 0"),
    ("demo --speed nan", "--speed=nan must be a finite number > 0"),
    ("demo --speed 1e30", "--speed=1e+30 must be > 0 and <= 3600"),
    ("demo --seed -1", "--seed=-1 must be >= 0"),
    ("demo paging --svg {file}", "is a file; expected a directory"),
    ("demo paging --html {file}", "is a file; expected a directory"),
    ("demo paging --svg {file}/frames", "file.txt/frames' cannot be created: Not a directory"),
    ("demo --list --svg {dir}/frames", "--list lists the scenes and plays none: --svg="),
    ("demo --list paging --seed 3", "--list lists the scenes and plays none: SCENE 'paging', "
                                    "--seed=3 would not be used; expected --list alone"),
    # check
    ("check", "name the exercise to grade: its number or name (above) or a path"),
    ("check --solution", "name the exercise to grade"),
    ("check 99", "there is no exercise '99'"),
    ("check nope", "is neither a number nor a .py file"),
    ("check 4 --timeout -1", "--timeout=-1.0 must be >= 0"),
    ("check 4 --timeout nan", "--timeout=nan must be a finite number >= 0"),
    ("check {missing_py}", "does not exist"),
    ("check ''", "exercise '' is empty; expected a number or a .py file"),
    ("check {dir}", "is a directory; expected a .py file"),
    ("check 4 --timeout 1e30", "--timeout=1e+30 must be >= 0 and <= 86400"),
    ("check {binary_py}", "has no EXERCISE"),
    ("check {missing_py} --solution", "missing.py' is a path, which --solution would not use (it "
                                      "grades the reference solution of an exercise named by its "
                                      "number or name); expected a number or an exercise name, "
                                      "or the path alone"),
    ("check 06_wrongname", "there is no exercise '06_wrongname'; expected one of 01_kv_bytes"),
    ("check --list 6", "--list lists the exercises and grades none: PATH|NUMBER '6' would not "
                       "be used; expected --list alone"),
    ("check --list --solution", "--solution would not be used"),
    # quiz
    ("quiz --only nope", "--only='nope' names no drill"),
    ("quiz --only 0", "--only='0' names no drill"),
    ("quiz --num-requests 0", "--num-requests=0 must be >= 1"),
    (f"quiz --num-requests {BIG}", f"--num-requests={BIG} x 4 sequences would need about"),
    ("quiz --seed -1", "--seed=-1 must be >= 0"),
    ("quiz --glossary --only why-16 --num-requests 5 --list", "--glossary prints the glossary "
                                                              "and runs no drill: "
                                                              "--only=why-16, --list, "
                                                              "--num-requests=5 would not be "
                                                              "used; expected --glossary alone"),
    ("quiz --list --answers --only 1 --only 2", "--list lists the drills and runs no drill: "
                                                "--answers, --only=1, --only=2 would not be used"),
    # present
    ("present", "name a deck"),
    ("present {missing}", "does not exist; expected an existing file"),
    ("present {dir}", "is a directory; expected a file"),
    ("present {binary}", "is not UTF-8 text"),
    ("present {empty}", "holds no slides"),
    ("present {unclosed}", "front matter (starting with ---) is never closed"),
    (f"present {DECK} --slide 0", "--slide=0 must be >= 1"),
    (f"present {DECK} --slide 999", "--slide 999 is outside 1.."),
    ("present --check-figures --figures-dir {file}", "is a file; expected a directory"),
    ("present {bad_demo}", "slide 2's <!-- demo: nope --> names no demo scene; expected one of "
                           "fragmentation, paging"),
    ("present --check-figures --figures-dir {missing}", "does not exist; expected an existing "
                                                        "directory"),
    (f"present {DECK} --figures-dir {{missing}}", "goes with --build-figures or --check-figures"),
    ("present --build-figures --check-figures --figures-dir {dir}/figs",
     "argument --check-figures: not allowed with argument --build-figures"),
    (f"present {DECK} --build-figures --figures-dir {{dir}}/figs",
     f"--build-figures works on the figures, not on a deck: the deck '{DECK}' would not be used"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_table(CASES, tmp_path_factory)


@pytest.mark.parametrize("line, fragment", CASES, ids=ids(CASES))
def test_bad_input_is_one_clear_line(results, line, fragment):
    check_one_clear_line(results, line, fragment, CASES)


def test_the_timeout_limit_agrees_with_the_grader():
    from minipaged.kit.cli import teaching
    from minipaged.kit.grader.core import MAX_TIMEOUT_S

    assert teaching.MAX_TIMEOUT_S == MAX_TIMEOUT_S


@pytest.mark.parametrize("top", ["import sys\nsys.exit(0)\n", "raise SystemExit(3)\n"])
def test_a_learners_file_that_exits_is_graded_as_not_loading(tmp_path, top):
    """sys.exit() at the top of a learner's file must not end the grader with status 0."""
    f = tmp_path / "mine.py"
    f.write_text(f'EXERCISE = "04_block_table"\n{top}')
    out = run_cli(["check", str(f)], timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr
    assert "raised SystemExit" in " ".join(out.stdout.split())


def test_a_timeout_too_short_for_the_import_is_a_result_not_a_traceback():
    out = run_cli(["check", "6", "--timeout", "0.000001"], timeout=60)
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-2000:]
    assert out.returncode == 1, (out.stdout[-500:], out.stderr[-500:])


def test_an_endless_loop_at_the_top_of_a_learners_file_times_out(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text('EXERCISE = "04_block_table"\nwhile True:\n    pass\n')
    out = run_cli(["check", str(f), "--timeout", "2"], timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr
    assert "stopped after 2 s" in " ".join(out.stdout.split())


def test_a_file_that_cannot_be_read_says_so_not_that_it_has_no_exercise_line(tmp_path):
    """A file without read permission (root reads any: then a write-only /proc file)."""
    mine = tmp_path / "mine.py"
    mine.write_text('EXERCISE = "04_block_table"\n')
    mine.chmod(0o200)
    for path in (mine, Path("/proc/sys/vm/compact_memory")):
        try:
            path.open("rb").close()
        except PermissionError:
            break
        except OSError:
            continue
    else:
        pytest.skip("every file is readable here")
    out = run_cli(["check", str(path)], timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"minipaged check: exercise file {str(path)!r} cannot be read: Permission denied"]
