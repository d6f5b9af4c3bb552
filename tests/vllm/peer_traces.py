"""Seeded workloads for the lockstep comparison with vLLM, one function per family.

Each family stresses one part of prefix caching; every function takes a seed and returns a
``Trace``. Pure Python (no vLLM, no torch), so that tests can be parametrised by family at
collection time on a machine without vLLM. Block size 4 keeps the traces short while giving
each prompt several full blocks; pools are sized so that most families evict (the report
counts evictions, preemptions and the duplicates vLLM creates).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

BS = 4


@dataclass
class RequestSpec:
    """One request of a trace. ``followups``: the next turns of a conversation, each (user
    tokens, reply length); a turn's prompt is the whole previous turn plus its user tokens."""
    rid: str
    arrival: int
    prompt: list[int]
    n_out: int
    followups: list[tuple[list[int], int]] = field(default_factory=list)
    gap: int = 1


@dataclass
class Trace:
    name: str
    seed: int
    num_blocks: int
    block_size: int
    requests: list[RequestSpec]
    greedy: bool = False      # replies a function of the tokens so far (identical prompts, replies)
    max_running: int = 6
    vocab: int = 1000
    max_steps: int = 400


def _tokens(rng: random.Random, n: int, vocab: int = 1000) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def _arrivals(rng: random.Random, n: int, max_gap: int = 2) -> list[int]:
    t, out = 0, []
    for _ in range(n):
        out.append(t)
        t += rng.randrange(max_gap + 1)
    return out


def shared_system_prompt(seed: int, bs: int = BS) -> Trace:
    """One system prompt (3.5 blocks) before every request, random suffixes and replies."""
    rng = random.Random(seed)
    system = _tokens(rng, 3 * bs + bs // 2)
    reqs = [RequestSpec(f"r{i}", t, system + _tokens(rng, rng.randint(1, 3 * bs)),
                        rng.randint(1, 3 * bs))
            for i, t in enumerate(_arrivals(rng, 40))]
    name = "shared-system-prompt" + ("" if bs == BS else f"-bs{bs}")
    return Trace(name, seed, num_blocks=40, block_size=bs, requests=reqs)


def shared_system_prompt_bs16(seed: int) -> Trace:
    """The same at vLLM's default block size, 16 (vllm/config/cache.py, ``block_size``)."""
    return shared_system_prompt(seed, 16)


def eviction_pressure(seed: int) -> Trace:
    """Ten prompt templates, picked with a skew, in a pool that holds only a few of them."""
    rng = random.Random(seed)
    templates = [_tokens(rng, rng.randint(2 * BS, 4 * BS)) for _ in range(10)]
    weights = [1 / (k + 1) for k in range(10)]
    reqs = []
    for i, t in enumerate(_arrivals(rng, 60)):
        base = rng.choices(templates, weights)[0]
        reqs.append(RequestSpec(f"r{i}", t, base + _tokens(rng, rng.randint(0, BS)),
                                rng.randint(1, 2 * BS)))
    return Trace("eviction-pressure", seed, num_blocks=18, block_size=BS, requests=reqs,
                 max_running=3)


def exact_multiples(seed: int) -> Trace:
    """Prompts of exactly k * BS tokens drawn from a few templates: the last-token rule
    (the last prompt token is always recomputed) costs a whole block on every repeat."""
    rng = random.Random(seed)
    templates = [_tokens(rng, BS * 5) for _ in range(4)]
    reqs = [RequestSpec(f"r{i}", t, rng.choice(templates)[:BS * rng.randint(1, 5)],
                        rng.randint(1, 2 * BS))
            for i, t in enumerate(_arrivals(rng, 40))]
    return Trace("exact-multiples", seed, num_blocks=30, block_size=BS, requests=reqs,
                 max_running=4)


def repeated_identical(seed: int) -> Trace:
    """Three prompts, each sent ten times, some at once (bursts), with greedy replies: the same
    prompt gets the same reply, so concurrent copies compute the same blocks twice."""
    rng = random.Random(seed)
    prompts = [_tokens(rng, rng.randint(2 * BS, 4 * BS) + rng.randint(0, 1) * 2)
               for _ in range(3)]
    reqs, t = [], 0
    for i in range(30):
        reqs.append(RequestSpec(f"r{i}", t, list(prompts[i % 3]), 2 * BS + 1))
        t += rng.choice((0, 0, 1, 3))
    return Trace("repeated-identical", seed, num_blocks=36, block_size=BS, requests=reqs,
                 greedy=True, max_running=4)


def no_sharing(seed: int) -> Trace:
    """Random prompts that share nothing: pure block accounting, every freed block cached."""
    rng = random.Random(seed)
    reqs = [RequestSpec(f"r{i}", t, _tokens(rng, rng.randint(1, 5 * BS)),
                        rng.randint(1, 3 * BS))
            for i, t in enumerate(_arrivals(rng, 40))]
    return Trace("no-sharing", seed, num_blocks=24, block_size=BS, requests=reqs)


def multi_turn(seed: int) -> Trace:
    """Conversations: each turn's prompt is the previous turn's prompt and reply plus a new user
    message, so a turn hits the blocks its predecessor filled while decoding, if they survive."""
    rng = random.Random(seed)
    reqs = []
    for c, t in enumerate(_arrivals(rng, 8, max_gap=3)):
        first = _tokens(rng, rng.randint(BS, 3 * BS))
        turns = [(_tokens(rng, rng.randint(2, 2 * BS)), rng.randint(2, 3 * BS))
                 for _ in range(rng.randint(2, 4))]
        reqs.append(RequestSpec(f"c{c}", t, first, rng.randint(2, 3 * BS), turns,
                                gap=rng.randint(1, 4)))
    return Trace("multi-turn", seed, num_blocks=40, block_size=BS, requests=reqs,
                 max_running=4)


def recompute_after_eviction(seed: int) -> Trace:
    """A conversation whose middle block is evicted and recomputed (hand-made, seed = tokens).

    A and B send the same two-block prompt P at once; B recomputes P's second block (the last
    prompt token is always recomputed) and decodes a third block after it. D evicts A's copy of
    the second block while B runs. B's next turn (P + B's reply + user tokens) recomputes the
    second block; the turn after that should hit the whole chain again."""
    rng = random.Random(seed)
    p = _tokens(rng, 2 * BS)
    reqs = [RequestSpec("A", 0, p, 1),
            RequestSpec("B", 0, list(p), BS + 1,
                        [(_tokens(rng, BS - 1), 1), (_tokens(rng, BS - 1), 1)], gap=1),
            RequestSpec("D", 1, _tokens(rng, 5 * BS + 2), 1)]
    return Trace("recompute-after-eviction", seed, num_blocks=9, block_size=BS, requests=reqs)


FAMILIES = {f.__name__.replace("_", "-"): f for f in (
    shared_system_prompt, shared_system_prompt_bs16, eviction_pressure, exact_multiples,
    repeated_identical, no_sharing, multi_turn, recompute_after_eviction)}
SEEDS = range(8)


# ---- scheduler traces ---------------------------------------------------------------------
@dataclass
class SchedTrace:
    """Requests for the scheduler comparison: (arrival step, id, prompt, output length)."""
    name: str
    seed: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    requests: list[tuple[int, str, list[int], int]]
    block_size: int = 16
    prefix_caching: bool = False
    max_steps: int = 600


def _sched(name: str, seed: int, num_blocks: int, max_num_seqs: int, budget: int,
           n: int = 20, max_prompt: int = 150, max_out: int = 40,
           system: int = 0) -> SchedTrace:
    """``system`` > 0: every prompt starts with the same ``system`` tokens, and both sides
    cache prefixes."""
    rng = random.Random(seed)
    head = _tokens(rng, system)
    reqs = [(t, f"r{i}", head + _tokens(rng, rng.randint(5, max_prompt)),
             rng.randint(1, max_out)) for i, t in enumerate(_arrivals(rng, n))]
    return SchedTrace(name, seed, num_blocks, max_num_seqs, budget, reqs,
                      prefix_caching=system > 0)


SCHED_FAMILIES = {
    # room for everything: admission order and chunk sizes only
    "roomy": lambda seed: _sched("roomy", seed, 96, 8, 256),
    # prompts longer than the budget: chunked prefill, some preemption
    "chunked": lambda seed: _sched("chunked", seed, 24, 8, 64),
    # a pool a few prompts fill: preemption victims and re-admissions
    "tight-memory": lambda seed: _sched("tight-memory", seed, 16, 4, 48),
    # a budget a handful of decodes fill: decodes and prefill chunks compete for it
    "small-budget": lambda seed: _sched("small-budget", seed, 40, 8, 16),
    # a shared system prompt, prefix caching on both sides: chunks start after the hits
    "prefix-cached": lambda seed: _sched("prefix-cached", seed, 32, 6, 64, system=40),
}
SCHED_SEEDS = range(6)
