"""The exercises and their grader: every reference solution passes, every untouched exercise
fails with a friendly message (never a traceback), and wrong answers are caught and shown.

Invariants the grader promises a learner, each tested here:
- a file anywhere (a copy under another name) is graded by its EXERCISE marker;
- ``minipaged check`` exits 0 only when every case passes, 1 otherwise, 2 for a bad argument;
- NotImplementedError, syntax errors, wrong exception types and endless loops are reported as
  one friendly paragraph, not a Python traceback;
- the first failing case is shown with its inputs, expected and actual values, and a hint.
How the grader compares a result with the expected one (``equal``, ``agree``) is tested in
tests/test_grader_compare.py.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from minipaged.kit.grader import all_exercises, grade, resolve
from minipaged.kit.grader.report import print_report

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = all_exercises()
NAMES = list(EXERCISES)


def _report(result) -> str:
    console = Console(record=True, width=100, color_system=None)
    print_report(result, console)
    return console.export_text()


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="100", TERM="dumb")
    return subprocess.run([sys.executable, "-m", "minipaged", "check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=env)


def test_at_least_twelve_exercises_each_with_a_solution():
    assert len(EXERCISES) >= 12
    for name in NAMES:
        assert (ROOT / "exercises" / f"{name}.py").is_file(), name
        assert (ROOT / "exercises" / "solutions" / f"{name}.py").is_file(), name


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name):
    exercise, path = resolve(str(EXERCISES[name].number), solution=True)
    result = grade(exercise, path)
    bad = [(r.name, r.status, r.detail) for r in result.results if r.status != "pass"]
    assert result.passed, (result.load_error, bad)
    assert len(result.results) >= 2


@pytest.mark.parametrize("name", NAMES)
def test_untouched_exercise_fails_friendly(name):
    exercise, path = resolve(name)
    result = grade(exercise, path)
    assert not result.passed
    assert result.untouched, [(r.name, r.status, r.detail) for r in result.results]
    text = _report(result)
    assert "Not started yet" in text
    assert "Traceback" not in text
    for fn in exercise.functions:
        assert fn in text


@pytest.mark.parametrize("name", NAMES)
def test_exercise_file_is_a_task_and_solution_is_marked(name):
    src = (ROOT / "exercises" / f"{name}.py").read_text()
    tree = ast.parse(src)
    assert ast.get_docstring(tree), "the exercise file states its task in a docstring"
    assert f'EXERCISE = "{name}"' in src
    todo = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
            and any(isinstance(s, ast.Raise) and "NotImplementedError" in ast.unparse(s)
                    for s in n.body)]
    assert todo, "at least one function left to write"
    for fn in todo:
        doc = ast.get_docstring(fn) or ""
        assert len(doc) > 20, f"{fn.name} needs a docstring with the task"
    sol = (ROOT / "exercises" / "solutions" / f"{name}.py").read_text()
    assert sol.lstrip('"').startswith("SPOILER"), "solutions are marked as spoilers"
    assert "NotImplementedError" not in sol


def test_cli_exit_codes_and_copy_anywhere(tmp_path):
    copy = tmp_path / "my_attempt.py"
    shutil.copy(ROOT / "exercises" / "solutions" / "04_block_table.py", copy)
    ok = _cli(str(copy), cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "all 4 cases pass" in ok.stdout
    untouched = _cli("4")
    assert untouched.returncode == 1
    assert "Not started yet" in untouched.stdout
    assert "Traceback" not in untouched.stdout + untouched.stderr
    missing = _cli("99")
    assert missing.returncode == 2 and "no exercise" in missing.stderr
    negative = _cli("4", "--timeout", "-1")
    assert negative.returncode == 2 and "--timeout=-1.0 must be >= 0" in negative.stderr
    with pytest.raises(ValueError, match="timeout_s=-1 must be"):
        grade(*resolve("4"), timeout_s=-1)


def test_wrong_answer_shows_first_failure_with_inputs(tmp_path):
    src = (ROOT / "exercises" / "solutions" / "06_paged_gather.py").read_text()
    buggy = src.replace("reshape(n * bs, hkv, d)[:seq_len]", "reshape(n * bs, hkv, d)")
    assert buggy != src
    path = tmp_path / "gather_attempt.py"
    path.write_text(buggy)
    exercise, resolved = resolve(str(path))
    result = grade(exercise, resolved)
    assert not result.passed and not result.untouched
    text = _report(result)
    assert "first case that does not pass" in text
    assert "inputs:" in text and "expected:" in text and "got:" in text
    assert "hint:" in text and "Traceback" not in text


def test_partial_progress_and_learner_exceptions(tmp_path):
    # Exercise 01 with one function right, one raising the wrong error, one untouched.
    path = tmp_path / "kv.py"
    path.write_text(
        'EXERCISE = "01_kv_bytes"\n'
        "def kv_bytes_per_token(L, H, D, b):\n"
        "    if min(L, H, D, b) < 1:\n"
        "        raise ValueError('bad')\n"
        "    return 2 * L * H * D * b\n"
        "def num_token_slots(kv, per):\n"
        "    return kv / per[0]\n"
        "def num_blocks(kv, per, bs):\n"
        "    raise NotImplementedError\n")
    result = grade(*resolve(str(path)))
    statuses = {r.name: r.status for r in result.results}
    assert statuses["bytes per token of real models"] == "pass"
    assert statuses["OPT-13B on 12 GiB: the paper's ~15.7K slots (Table 1)"] == "error"
    text = _report(result)
    assert "TypeError" in text and "kv.py:7" in text
    assert "Traceback" not in text


def test_syntax_error_and_endless_loop_are_reported(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text('EXERCISE = "09_beam_search"\ndef fork_and_free(:\n')
    result = grade(*resolve(str(bad)))
    assert result.load_error and "syntax error" in result.load_error
    assert "Traceback" not in _report(result)

    loop = tmp_path / "loop.py"
    loop.write_text('EXERCISE = "11_preemption"\n'
                    "def blocks_for_step(seq_lens, block_size):\n"
                    "    while True:\n"
                    "        pass\n"
                    "def choose_victims(g, f, b):\n    raise NotImplementedError\n"
                    "def swap_or_recompute(*a):\n    raise NotImplementedError\n")
    if not hasattr(__import__("signal"), "SIGALRM"):
        pytest.skip("case time limits need SIGALRM")
    result = grade(*resolve(str(loop)), timeout_s=0.5)
    assert result.results[0].status == "timeout"


def test_resolve_rejects_unknown_files(tmp_path):
    stray = tmp_path / "notes.py"
    stray.write_text("x = 1\n")
    with pytest.raises(ValueError, match="EXERCISE"):
        resolve(str(stray))
    with pytest.raises(ValueError, match="does not exist"):
        resolve(str(tmp_path / "absent.py"))


# ---- wrong solutions the grader must catch, each written here from the reference ------------

def _mutant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """The reference solution of ``name`` with one deliberate bug (``old`` -> ``new``)."""
    src = (ROOT / "exercises" / "solutions" / f"{name}.py").read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"wrong_{name}_{abs(hash(new)) % 10**6}.py"
    path.write_text(src.replace(old, new))
    return path


def _first_failure(path: Path):
    result = grade(*resolve(str(path)))
    assert not result.passed and not result.untouched
    return next(r for r in result.results if r.status != "pass"), _report(result)


def _section(text: str, label: str, until: str) -> str:
    return text.split(f"{label}:", 1)[1].split(until, 1)[0]


RANGE_CHECK = "if not 0 <= block < len(self._counts):"


def test_allocator_without_a_lower_bound_fails(tmp_path):
    # free(-1) would free block 3: Python lists accept negative indices.
    path = _mutant(tmp_path, "03_block_allocator", RANGE_CHECK,
                   "if not block < len(self._counts):")
    first, text = _first_failure(path)
    assert first.name == "block ids out of range are rejected, at both ends"
    assert "(-1)" in first.detail and "negative indices" in first.hint
    assert "hint: Python lists accept negative indices" in " ".join(text.split())


def test_allocator_with_an_off_by_one_upper_bound_fails(tmp_path):
    path = _mutant(tmp_path, "03_block_allocator", RANGE_CHECK,
                   "if not 0 <= block <= len(self._counts):")
    first, text = _first_failure(path)
    assert first.name == "block ids out of range are rejected, at both ends"
    assert "(4) on a pool of 4 blocks" in first.detail
    assert "IndexError" in _section(text, "got", "hint:")  # the wrong exception is named
    assert "upper bound is exclusive" in first.hint


def test_a_rejected_call_that_changes_state_fails(tmp_path):
    # free() decrements before it notices the double free: it raises, but the count is -1.
    error = '            raise ValueError(f"block={block} is already free (double free)")\n'
    path = _mutant(tmp_path, "03_block_allocator",
                   "        if self._counts[block] == 0:\n" + error +
                   "        self._counts[block] -= 1\n",
                   "        self._counts[block] -= 1\n"
                   "        if self._counts[block] < 0:\n" + error)
    first, text = _first_failure(path)
    assert "the rejected call changed the state" in first.detail
    assert "a double free must raise ValueError" in first.detail
    failure = first.failure
    assert failure.expected == {"ref_counts": [0, 0, 0, 0]}
    assert failure.got["ref_counts"][0] == -1
    assert "leave every structure as it was" in first.hint


def test_failure_shows_the_value_that_differs(tmp_path):
    # A spurious copy recorded by a sole owner that still writes in place: the slot is right
    # (6), the copies are wrong, and the report must show the copies, not the slot twice.
    path = _mutant(tmp_path, "08_copy_on_write",
                   "        self.seq_lens[seq_id] = pos + 1\n",
                   "        elif offset:\n"
                   "            self.copies.append((table[-1], table[-1]))\n"
                   "        self.seq_lens[seq_id] = pos + 1\n")
    first, text = _first_failure(path)
    assert first.failure.expected == [] and first.failure.got
    assert first.failure.expected != first.failure.got
    expected, got = _section(text, "expected", "got:"), _section(text, "got", "hint:")
    assert expected.strip(" │\n") != got.strip(" │\n")
    assert "(1, 1)" in got


def test_hints_differ_per_case_and_per_failure(tmp_path):
    for ex in EXERCISES.values():
        hints = [c.hint for c in ex.cases]
        assert all(len(h) > 20 for h in hints), ex.name
        assert len(set(hints)) == len(hints), f"two cases of {ex.name} share a hint"
    low = _first_failure(_mutant(tmp_path, "03_block_allocator", RANGE_CHECK,
                                 "if not block < len(self._counts):"))[0].hint
    high = _first_failure(_mutant(tmp_path, "03_block_allocator", RANGE_CHECK,
                                  "if not 0 <= block <= len(self._counts):"))[0].hint
    assert low != high


# Wrong solutions that once passed every case: each fails now, in words that name the slip.
HOLES = [
    ("01_kv_bytes", "return 2 * num_layers", "return 2.0 * num_layers", "must return an int"),
    ("05_reshape_and_cache", "    if key.shape != value.shape:", "    if False:",
     "key [2, 2, 2] vs value [2, 1, 2]"),
    ("07_online_softmax", "key_cache[b, :, :n, :]", "key_cache[:, :, :n, :][b]",
     "blocks at once"),
    ("10_prefix_cache", "            if self.ref_counts[b] == 0:\n                raise",
     "            if False:\n                raise", "a double free"),
    ("11_preemption", "if swap < recompute", "if swap <= recompute", "strictly less"),
    ("12_flashinfer_csr", "[tables[s, :p] for s, p", "[tables[s][tables[s] >= 0] for s, p",
     "wrong kv_indices"),
    ("13_two_level_table", "if logical_block < 0 or logical_block //", "if logical_block //",
     "out of range"),
]


@pytest.mark.parametrize("name, old, new, words", HOLES, ids=[h[0] for h in HOLES])
def test_wrong_solutions_that_once_passed_fail(tmp_path, name, old, new, words):
    first, _ = _first_failure(_mutant(tmp_path, name, old, new))
    assert words in first.detail, first.detail
