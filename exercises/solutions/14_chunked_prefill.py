"""SPOILER: reference solution of exercise 14 (chunked prefill: one step's token budget).

Try the exercise first: exercises/14_chunked_prefill.py, graded by `minipaged check 14`.
"""

from __future__ import annotations

EXERCISE = "14_chunked_prefill"


def _check_budget(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an int >= 1")


def schedule_step(decodes, prefills, token_budget):
    _check_budget("token_budget", token_budget)
    seen = set()
    for rid in list(decodes) + [p[0] for p in prefills]:
        if rid in seen:
            raise ValueError(f"request {rid!r} appears twice")
        seen.add(rid)
    for rid, num_computed, prompt_len in prefills:
        if not 0 <= num_computed < prompt_len:
            raise ValueError(f"request {rid!r}: num_computed={num_computed} must be in "
                             f"[0, prompt_len={prompt_len})")
    budget = token_budget
    scheduled = list(decodes[:budget])  # one token each, oldest first
    budget -= len(scheduled)
    chunks = []
    for rid, num_computed, prompt_len in prefills:
        if budget == 0:
            break
        end = min(prompt_len, num_computed + budget)
        chunks.append((rid, num_computed, end))
        budget -= end - num_computed
    return scheduled, chunks


def prefill_steps(prompt_len, num_decodes, token_budget):
    _check_budget("prompt_len", prompt_len)
    _check_budget("token_budget", token_budget)
    if isinstance(num_decodes, bool) or not isinstance(num_decodes, int) or num_decodes < 0:
        raise ValueError(f"num_decodes={num_decodes!r} must be an int >= 0")
    per_step = token_budget - num_decodes
    if per_step < 1:
        raise ValueError(f"num_decodes={num_decodes} leaves no room in token_budget="
                         f"{token_budget}: the prompt would never get a token")
    return -(-prompt_len // per_step)
