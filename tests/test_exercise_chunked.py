"""Exercise 14 (chunked prefill) and its grader: wrong solutions are caught, with the right hint.

tests/test_exercises.py already grades the reference solution and the untouched stub of every
exercise, this one included; here each deliberate bug, written into a copy of the reference
solution, must fail the case that is about it, with a hint that names the rule it breaks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minipaged.kit.grader import all_exercises, ex_chunked, grade, resolve
from minipaged.kit.grader.core import CaseFailure, load_module

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "exercises" / "solutions" / "14_chunked_prefill.py"


def _mutant(tmp_path: Path, old: str, new: str) -> Path:
    src = SOLUTION.read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"wrong_{abs(hash(new)) % 10**6}.py"
    path.write_text(src.replace(old, new))
    return path


def _first_failure(path: Path):
    result = grade(*resolve(str(path)))
    assert not result.passed and not result.untouched
    return next(r for r in result.results if r.status != "pass")


def test_exercise_14_is_registered_and_resolves_to_its_files():
    assert "14_chunked_prefill" in all_exercises()
    exercise, path = resolve("14")
    assert path == ROOT / "exercises" / "14_chunked_prefill.py"
    assert resolve("14", solution=True)[1] == SOLUTION
    assert len(exercise.cases) >= 6


@pytest.mark.parametrize("old, new, case, hint", [
    ("end = min(prompt_len, num_computed + budget)", "end = num_computed + budget",
     "worked examples", "never runs past its prompt's end"),
    ("chunks.append((rid, num_computed, end))", "chunks.append((rid, 0, end))",
     "worked examples", "starts at num_computed"),
    ("        if budget == 0:\n            break\n", "",
     "worked examples", "never emit an empty chunk"),
    ("scheduled = list(decodes[:budget])", "scheduled = list(decodes)",
     "more decodes than budget", "decodes come first"),
    ("    for rid, num_computed, prompt_len in prefills:\n        if budget == 0:",
     "    for rid, num_computed, prompt_len in reversed(prefills):\n        if budget == 0:",
     "worked examples", "first come first served"),
    ("    scheduled = list(decodes[:budget])",
     "    scheduled = decodes[:budget]\n    del decodes[:budget]",
     "worked examples", "must not modify"),
    ("return -(-prompt_len // per_step)", "return prompt_len // per_step + 1",
     "prefill_steps", "round up"),
])
def test_wrong_solutions_fail_with_a_hint_for_their_bug(tmp_path, old, new, case, hint):
    first = _first_failure(_mutant(tmp_path, old, new))
    assert first.name.startswith(case), first.name
    assert hint in first.hint + first.detail, (first.hint, first.detail)


def test_budget_checked_after_touching_the_queues_fails(tmp_path):
    # Validating token_budget only after looking at the decodes is caught: the grader passes
    # queues that raise on any use together with a bad budget.
    path = _mutant(tmp_path, '    _check_budget("token_budget", token_budget)\n    seen = set()\n',
                   '    seen = set(decodes)\n    _check_budget("token_budget", token_budget)\n'
                   '    seen = set()\n')
    first = _first_failure(path)
    assert first.name.startswith("bad input is rejected")
    assert "RuntimeError" in str(first.failure.got)


def test_the_scheduler_replay_catches_a_rule_the_reference_cases_also_catch(tmp_path):
    # Last-come-first-served prefills must disagree with minipaged's Scheduler as well.
    path = _mutant(tmp_path,
                   "    for rid, num_computed, prompt_len in prefills:\n        if budget == 0:",
                   "    for rid, num_computed, prompt_len in reversed(prefills):\n"
                   "        if budget == 0:")
    module = load_module(path)
    with pytest.raises(CaseFailure, match="differs from minipaged's Scheduler"):
        ex_chunked._scheduler(module)
    ex_chunked._scheduler(load_module(SOLUTION))  # the reference itself agrees


def test_reference_rule_on_a_small_step():
    # The grader's own reference, by hand: 2 decodes, then L cut at the budget, S waits.
    assert ex_chunked._ref_step(["A", "B"], [("L", 0, 20), ("S", 0, 3)], 8) == (
        ["A", "B"], [("L", 0, 6)])
    assert ex_chunked._ref_step(["A", "B", "C"], [("L", 0, 9)], 2) == (["A", "B"], [])
