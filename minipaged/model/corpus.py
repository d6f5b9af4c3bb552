"""The training corpus, generated procedurally: counting down, with answers that can be checked.

What it teaches: a demo of paging is only convincing if you can tell a right answer from a wrong
one. The tiny model learns one task, counting down to zero, with outputs long enough to fill
many KV blocks:

    prompt      "count down from 47:"
    completion  " 47 46 45 ... 2 1 0." followed by <eos>

Counting down from 59 is 171 characters, eleven blocks of 16 tokens, so one generation crosses
many block boundaries, and sharing, copy-on-write and preemption all act on real activations.
``check(prompt, completion)`` says whether an answer is right; nothing is copied from elsewhere:
this file is the whole data set.

Why down to zero and not "count 17 to 42": every step of counting down is local (decrement the
number just written, borrowing like a child does; stop after 0), so a 150K-parameter model
learns it in minutes. Stopping at an arbitrary end number needs the model to compare what it
just wrote with digits far back in the prompt, which a first training run of this size did not
learn (it counted perfectly and stopped after the usual number of steps).

Held-out prompts: starts with ``n % 6 == 1`` are never trained on, so the score the training
script reports is on unseen prompts (the model must copy an unseen start, then keep counting).

Read next: decoder.py (the model), train.py (how the shipped checkpoint was made).
"""

from __future__ import annotations

import random
import re

MAX_START = 59       # starts drawn from 0 .. MAX_START

_PROMPT_RE = re.compile(r"^count down from (\d+):$")


def is_held_out(start: int) -> bool:
    return start % 6 == 1


def prompt_for(start: int) -> str:
    return f"count down from {start}:"


def answer_for(start: int) -> str:
    return " " + " ".join(str(i) for i in range(start, -1, -1)) + "."


def all_starts() -> list[int]:
    return list(range(MAX_START + 1))


def train_starts() -> list[int]:
    return [n for n in all_starts() if not is_held_out(n)]


def held_out_starts() -> list[int]:
    return [n for n in all_starts() if is_held_out(n)]


def check(prompt: str, completion: str) -> bool:
    """True when ``completion`` is exactly the right answer to a counting ``prompt``."""
    m = _PROMPT_RE.match(prompt)
    if m is None:
        raise ValueError(f"prompt {prompt!r} is not a counting prompt like 'count down from 47:'")
    return completion == answer_for(int(m.group(1)))


def sample_document(rng: random.Random, starts: list[int]) -> tuple[str, str]:
    """One (prompt, completion) training example with a start drawn from ``starts``."""
    n = starts[rng.randrange(len(starts))]
    return prompt_for(n), answer_for(n)
