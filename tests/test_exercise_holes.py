"""Wrong solutions that once passed every hidden case of their exercise: each must fail now.

Each is the reference solution with one slip a learner makes (a missing bound, a parameter
ignored, an input mutated, an unstable softmax), and each must fail with words that name the
slip, in the failing case's name, its message or its hint. tests/test_exercises.py holds the
first such list and the grader's other promises.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minipaged.kit.grader import grade, resolve

ROOT = Path(__file__).resolve().parent.parent

HOLES = [
    # 0 bytes hold 0 tokens: only a negative budget is an error
    ("01_kv_bytes", "if kv_cache_bytes < 0:", "if kv_cache_bytes < 1:",
     "a budget of 0 bytes holds 0"),
    ("02_contiguous_waste", "if not 1 <= prompt_len <= final_len:",
     "if not prompt_len <= final_len:", "prompt_len=0"),
    ("02_contiguous_waste", "        return max_seq_len\n", "        return 2048\n",
     "whatever it is"),
    ("04_block_table", "if not 0 <= start <= end <= len", "if not end <= len",
     "a negative start"),
    # the row's entries past its blocks may hold anything: checking them rejects a good table
    ("06_paged_gather", "blocks.max() >= nb", "row.max() >= nb", "hold junk"),
    ("06_paged_gather", "        logits = logits - logits.max(axis=1, keepdims=True)\n", "",
     "subtract the largest logit"),
    ("07_online_softmax", "            mb = logits.max(axis=1)\n", "            mb = np.zeros(h)\n",
     "subtract the largest logit"),
    ("07_online_softmax", "    group = h // hkv\n",
     "    group = h // hkv\n    if (block_tables >= nb).any():\n        raise ValueError('?')\n",
     "hold junk"),
    ("09_beam_search", "if not 0 <= p < len(tables):", "if p >= len(tables):",
     "parent index -1"),
    ("11_preemption", "prefill_tokens_per_s <= 0:", "prefill_tokens_per_s == 0:", "=-1e4"),
    # sorting the caller's list in place, then popping the victims off it
    ("11_preemption", "kept = [groups[i] for i in order]",
     'kept = groups\n    kept.sort(key=lambda g: g["arrival"])', "leave its groups"),
    ("12_flashinfer_csr", "(last < 1).any() or ", "", "last_page_len 0"),
]


@pytest.mark.parametrize("name, old, new, words", HOLES, ids=[h[0] for h in HOLES])
def test_wrong_solutions_that_once_passed_fail(tmp_path, name, old, new, words):
    src = (ROOT / "exercises" / "solutions" / f"{name}.py").read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"wrong_{name}.py"
    path.write_text(src.replace(old, new))
    result = grade(*resolve(str(path)))
    assert not result.passed and not result.untouched
    first = next(r for r in result.results if r.status != "pass")
    said = f"{first.name}: {first.detail} (hint: {first.hint})"
    assert words in said, said
