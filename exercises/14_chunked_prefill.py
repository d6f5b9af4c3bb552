"""Exercise 14: chunked prefill, the token budget of one scheduler step.

Lesson: lessons/11_*.py (chunked prefill).  Check: minipaged check 14

With chunked prefill (vLLM v1's default, vllm/engine/arg_utils.py) every step has one token
budget, ``max_num_batched_tokens``, shared by decodes and prefills, and one forward pass runs
both:
1. decodes first: each decoding request costs one token, oldest first; a decode that no
   longer fits waits for the next step;
2. then prefills, first come first served: each request still prefilling gets the next chunk
   of its prompt, as many tokens as it still needs or as the budget has left, whichever is
   fewer. Its first ``num_computed`` prompt tokens already have K/V in the paged cache, so
   the chunk starts there and never runs past the prompt's end;
3. the step stops when the budget is spent; a prompt cut short continues next step.
No request gets an empty chunk, and a step never uses more tokens than its budget.
"""

from __future__ import annotations

EXERCISE = "14_chunked_prefill"


def schedule_step(decodes: list, prefills: list[tuple], token_budget: int) -> tuple[list, list]:
    """One step's plan: (scheduled_decodes, chunks).

    decodes: ids of the running requests that are decoding, oldest first.
    prefills: (request_id, num_computed, prompt_len) for every request still prefilling, in
        arrival order (partly prefilled ones and new ones alike); 0 <= num_computed < prompt_len.
    token_budget: tokens this step may compute (max_num_batched_tokens).
    Returns scheduled_decodes, the ids that decode this step (in the given order), and chunks,
    a list of (request_id, start, end): compute K/V of prompt positions [start, end), with
    start = num_computed.
    Errors: ValueError, raised before anything else is looked at, when token_budget is not an
    int >= 1; ValueError when a prefill's num_computed is outside [0, prompt_len) or a request
    id appears twice (in either list or in both). The inputs are never modified.
    Invariant: len(scheduled_decodes) + sum(end - start) <= token_budget.
    """
    raise NotImplementedError


def prefill_steps(prompt_len: int, num_decodes: int, token_budget: int) -> int:
    """Steps a new prompt of prompt_len tokens, alone in the prefill queue, takes until its
    first token, while num_decodes other requests decode in every step.

    Each step the decodes take num_decodes tokens first and the prompt gets the rest.
    Errors: ValueError when prompt_len < 1, num_decodes < 0, token_budget < 1, or when
    num_decodes >= token_budget (the prompt would never get a token).
    Hint: it is one ceiling division.
    """
    raise NotImplementedError
