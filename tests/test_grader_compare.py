"""How the grader compares a learner's result with the expected one: ``equal`` and ``agree``.

Promises tested here: ``equal`` names the first difference (the index in a list or an array,
the keys of a dict that differ) and treats NaN as equal to NaN; ``agree`` runs the learner's
function and the reference on each case, reports the first mismatch with its inputs by
parameter name (the learner gets a copy of them); one tolerance rule serves numbers and arrays.
The exercises and the grader's reports are tested in tests/test_exercises.py.
"""

from __future__ import annotations

import numpy as np
import pytest


def test_equal_reports_the_first_difference():
    from minipaged.kit.grader.core import CaseFailure, equal

    with pytest.raises(CaseFailure) as e:
        equal([1, 2, 3], [1, 5, 3], "lists")
    assert "index 1" in e.value.message
    with pytest.raises(CaseFailure) as e:
        equal({"a": 1, "b": 2}, {"a": 1, "b": 3}, "dicts")
    assert (e.value.expected, e.value.got) == ({"b": 3}, {"b": 2})
    big = np.zeros((8, 8))
    with pytest.raises(CaseFailure) as e:
        equal(big + np.eye(8)[3:4].T @ np.eye(8)[5:6], big, "arrays")
    assert "[3, 5]" in e.value.message and (e.value.expected, e.value.got) == (0.0, 1.0)
    equal(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), "NaN equals NaN")


def test_agree_reports_the_first_mismatch_by_parameter_name():
    from minipaged.kit.grader.core import CaseFailure, agree, equal

    def learner(tokens, block_size):
        tokens.append(99)                        # a learner that mutates its input
        return len(tokens) // block_size

    cases = [([1, 2, 3, 4], 2), ([1, 2, 3], 2), ([1], 4)]
    with pytest.raises(CaseFailure) as e:
        agree(learner, lambda toks, bs: -(-len(toks) // bs), cases, "wrong count")
    # the first two agree (5 // 2 = 2, 4 // 2 = 2); the third does not (2 // 4 = 0, not 1)
    assert e.value.inputs == {"tokens": [1], "block_size": 4}
    assert (e.value.expected, e.value.got) == (1, 0)
    assert cases[0][0] == [1, 2, 3, 4]           # the learner got a copy
    with pytest.raises(CaseFailure) as e:
        agree(lambda *args: 0, lambda a, b: 1, [(3, 4)], "wrong")
    assert e.value.inputs == {"argument 0": 3, "argument 1": 4}
    # one tolerance rule: |got - want| <= tol * (1 + |want|), for numbers and arrays alike
    equal(1.0 + 1e-13, 1.0, "within", tol=1e-12)
    with pytest.raises(CaseFailure) as e:
        equal(np.array([1.0, 2.5]), np.array([1.0, 2.0]), "beyond", tol=1e-9)
    assert "index [1]" in e.value.message and "tolerance 1e-09" in e.value.message
