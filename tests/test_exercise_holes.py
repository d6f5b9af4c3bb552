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
    # "== 0" where the rule is "< 1": a negative size passes
    ("01_kv_bytes", "if value < 1:", "if value < 1 if name == 'head_size' else value == 0:",
     "num_layers=-8"),
    ("01_kv_bytes", "return num_token_slots(kv_cache_bytes, bytes_per_token) // block_size",
     "num_token_slots(kv_cache_bytes, 1)\n"
     "    return kv_cache_bytes // (bytes_per_token * block_size)",
     "bytes_per_token=-1000 (num_blocks)"),
    ("02_contiguous_waste", "if final_len > max_seq_len:",
     "if final_len > max_seq_len and policy == 'max':", "(policy 'pow2')"),
    ("02_contiguous_waste", "size = reservation_size(policy, prompt_len, final_len, max_seq_len)",
     "size = reservation_size('pow2' if policy == 'pow2' else 'max' if policy == 'max' else "
     "'oracle', prompt_len, final_len, max_seq_len)", "contiguous_breakdown's policy"),
    ("03_block_allocator", "if num_blocks < 1:", "if num_blocks == 0:", "num_blocks=-1"),
    ("04_block_table", "    if block_size < 1:\n        raise ValueError(f\"block_size",
     "    if block_size == 0:\n        raise ValueError(f\"block_size", "block_size=-4"),
    ("04_block_table", "table[positions // block_size] * block_size + positions % block_size",
     "np.array([block_table[p // block_size] * block_size + p % block_size\n"
     "                     for p in range(start, end)])", "must be int64"),
    ("04_block_table", "    for s, t in enumerate(tables):\n        out[s, :len(t)] = t\n",
     "    for s, t in enumerate(tables):\n        t += [pad] * (mb - len(t))\n"
     "        out[s] = t\n", "leave its tables"),
    ("05_reshape_and_cache", "keep = slots >= 0", "keep = slots != -1", "a negative slot is"),
    ("05_reshape_and_cache", "    if value_cache.shape != key_cache.shape:", "    if False:",
     "value_cache head size 3"),
    # scaling the caller's query in place: the output is right, the query is not
    ("06_paged_gather", "    out = np.empty_like(query)\n",
     "    query *= scale\n    scale = 1.0\n    out = np.empty_like(query)\n",
     "changed its argument query"),
    ("07_online_softmax", "    out = np.empty_like(query)\n",
     "    query *= scale\n    scale = 1.0\n    out = np.empty_like(query)\n",
     "changed its argument query"),
    ("06_paged_gather", "1.0 / np.sqrt(d) if scale is None else scale",
     "scale or 1.0 / np.sqrt(d)", "scale=0.0 is a scale too"),
    # copy-on-write lowering the shared block's count before taking the fresh one
    ("08_copy_on_write", "            new = self._new_block()\n            self.copies.append(",
     "            self.ref_counts[old] -= 1\n            new = self._new_block()\n"
     "            self.ref_counts[old] += 1\n            self.copies.append(",
     "a copy-on-write with no free block"),
    # a double free noticed only when a table's first block is free
    ("10_prefix_cache", "        for b in block_table:\n            if self.ref_counts[b] == 0:",
     "        for b in block_table[:1]:\n            if self.ref_counts[b] == 0:",
     "a double free"),
    ("12_flashinfer_csr", "if lens.size and lens.min() < 1:", "if (lens == 0).any():",
     "seq_len -3"),
    ("12_flashinfer_csr", "if last.shape != pages.shape or (last < 1)", "if (last < 1)",
     "one kv_last_page_len for two sequences"),
    ("13_two_level_table", "if leaf_size < 1:", "if leaf_size == 0:", "leaf_size=-2"),
    ("14_chunked_prefill", "if not 0 <= num_computed < prompt_len:",
     "if num_computed < 0 or num_computed == prompt_len:", "num_computed > prompt_len"),
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
