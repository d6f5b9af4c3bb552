"""Hidden cases for exercise 14 (chunked prefill: one step's token budget).

``schedule_step`` is compared with ``_ref_step``, the exercise's rules written out again, on
worked examples and random steps, and replayed against the project's own ``Scheduler``
(``SchedulerConfig(chunked_prefill=True)``) over a paged cache: each step the learner gets the
requests the scheduler has, and must return the decodes and prefill chunks the scheduler
returned. The replay only builds steps where every decode fits in the budget, because there
the two rules agree by construction (the exercise, like vLLM v1, lets the decodes that do not
fit wait: vllm/v1/core/sched/scheduler.py). A failing random step is given a hint that names
the rule it broke.
"""

from __future__ import annotations

import copy

import numpy as np

from minipaged._checks import cdiv
from minipaged.kit.grader.core import CaseFailure, Exercise, agree, equal, expect, rejects
from minipaged.serving.memory_policy import make_policy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig, StepResult

EX_14 = Exercise("14_chunked_prefill",
                 "chunked prefill: one token budget, decodes first, prefill chunks",
                 ("schedule_step", "prefill_steps"))


def _ref_step(decodes, prefills, budget):
    """The exercise's rule: decodes first (one token each), then FCFS chunks of the rest."""
    scheduled = list(decodes[:budget])
    budget -= len(scheduled)
    chunks = []
    for rid, done, n in prefills:
        if budget == 0:
            break
        end = min(n, done + budget)
        chunks.append((rid, done, end))
        budget -= end - done
    return scheduled, chunks


def _normalize(got) -> tuple[list, list]:
    """The learner's (decodes, chunks) as plain lists of ids and (id, start, end) tuples."""
    try:
        decodes, chunks = got if isinstance(got, (tuple, list)) else ()
        decodes, chunks = list(decodes), [tuple(c) for c in chunks]
    except (TypeError, ValueError):
        chunks = None
    if chunks is None or any(len(c) != 3 for c in chunks):
        raise CaseFailure("schedule_step must return a pair (scheduled_decodes, chunks), each "
                          "chunk a (request_id, start, end) tuple",
                          expected="(list of ids, [(request_id, start, end), ...])", got=got,
                          hint="return two lists: the decodes of this step, then the prefill "
                               "chunks, each a triple: the request, the first prompt position "
                               "it computes and the position after its last")
    return decodes, chunks


def _hint_for(decodes, prefills, budget, got) -> str:
    """Name the rule the learner's answer breaks, so the hint fits this failure."""
    got_d, got_c = got
    lens = {rid: n for rid, _, n in prefills}
    starts = {rid: done for rid, done, _ in prefills}
    used = len(got_d) + sum(e - s for _, s, e in got_c if isinstance(e, int)
                            and isinstance(s, int))
    if any(rid in starts and s != starts[rid] for rid, s, _ in got_c):
        return "a chunk starts at num_computed: those tokens already have K/V in the cache"
    if used > budget:
        return (f"this step uses {used} tokens with a budget of {budget}: count one token per "
                f"decode and end - start per chunk, and stop when the budget is spent")
    if any(e == s for _, s, e in got_c):
        return "never emit an empty chunk: stop handing out chunks once the budget is spent"
    if any(rid in lens and e > lens[rid] for rid, _, e in got_c):
        return "a chunk never runs past its prompt's end: end = min(prompt_len, start + left)"
    if got_d != list(decodes[:budget]):
        return ("decodes come first, one token each, in the order given; only the ones beyond "
                "the budget wait")
    return ("prefills are first come first served: the oldest prompt gets as much as it still "
            "needs before a later one gets anything")


def _same_plan(m, decodes, prefills, budget, want, message: str, inputs: dict) -> None:
    """schedule_step's answer must be ``want``; a wrong one gets the hint of the rule it breaks."""
    got = _normalize(m.schedule_step(decodes, prefills, budget))
    if got != want:
        equal(got, want, message, inputs, hint=_hint_for(decodes, prefills, budget, got))


def _check_step(m, decodes, prefills, budget, message: str) -> None:
    before = copy.deepcopy((decodes, prefills))
    inputs = dict(decodes=before[0], prefills=before[1], token_budget=budget)
    _same_plan(m, decodes, prefills, budget, _ref_step(decodes, prefills, budget), message,
               inputs)
    equal((decodes, prefills), before, "schedule_step must not modify its inputs", inputs,
          hint="build new lists for the answer; the scheduler still needs its own queues")


@EX_14.case("worked examples: decodes first, then one prompt cut at the budget",
            hint="decodes take one token each first; what is left goes to the prompts in "
                 "arrival order")
def _worked(m):
    _check_step(m, ["A", "B"], [("L", 0, 20), ("S", 0, 3)], 8,
                "2 decodes leave 6 tokens: L gets [0, 6), S waits")
    _check_step(m, ["A", "B"], [("L", 12, 20), ("S", 0, 3)], 12,
                "L needs 8 more tokens, S gets the 2 left")
    _check_step(m, [], [("L", 0, 5)], 5, "a prompt that fits exactly is one chunk")


@EX_14.case("a chunk stops at its prompt's end and passes the rest on",
            hint="end = min(prompt_len, start + budget left); a finished prompt hands what is "
                 "left to the next one")
def _end(m):
    _check_step(m, ["A"], [("X", 3, 5), ("Y", 0, 2), ("Z", 0, 100)], 16,
                "X needs 2, Y needs 2, Z gets the remaining 11")
    _check_step(m, [], [("X", 9, 10), ("Y", 0, 1)], 64, "prompts one token short each get one")


@EX_14.case("more decodes than budget: the extra decodes wait and no prefill runs",
            hint="the budget caps decodes too: with B tokens only the first B decodes run")
def _too_many(m):
    _check_step(m, ["A", "B", "C", "D"], [("L", 0, 9)], 3, "3 tokens: A, B and C decode")
    _check_step(m, ["A", "B"], [("L", 0, 9)], 2, "the decodes spend the whole budget")


@EX_14.case("random steps against the rules",
            hint="follow the three rules of the module docstring in order: decodes, then "
                 "chunks first come first served, stop when the budget is spent")
def _random(m):
    rng = np.random.default_rng(1414)
    for _ in range(300):
        ids = [f"r{i}" for i in rng.permutation(12)]
        nd = int(rng.integers(0, 6))
        decodes = ids[:nd]
        prefills = []
        for rid in ids[nd:nd + int(rng.integers(0, 5))]:
            n = int(rng.integers(1, 40))
            prefills.append((rid, int(rng.integers(0, n)), n))
        budget = int(rng.choice([1, 2, 3, 5, 8, 16, 32, 64]))
        _check_step(m, decodes, prefills, budget, "wrong plan for this step")


def _replay(m, rng, budget: int, num_requests: int, bs: int) -> int:
    """Drive the project's Scheduler; return how many steps were compared."""
    # Room for every request at once (prompts up to 3 * budget + 1 tokens, outputs up to 5):
    # nothing is ever preempted, so the scheduler's plan depends on the budget alone.
    policy = make_policy("paged", num_slots=num_requests * 256, block_size=bs,
                         max_seq_len=256, watermark=0.0)
    sched = Scheduler(policy, SchedulerConfig(max_model_len=256, chunked_prefill=True,
                                              max_num_batched_tokens=budget))
    # Our own bookkeeping from add_request and the SchedulerOutputs (dicts keep arrival order).
    prompt_len: dict[str, int] = {}
    computed: dict[str, int] = {}
    log: list[str] = []
    added = steps = 0
    while added < num_requests or sched.has_unfinished():
        if added < num_requests and rng.random() < 0.5:
            rid, n = f"q{added}", int(rng.integers(1, 3 * budget + 2))
            sched.add_request(rid, [1 + (added + i) % 50 for i in range(n)],
                              int(rng.integers(1, 6)), arrival_s=float(steps))
            prompt_len[rid], computed[rid] = n, 0
            log.append(f"add {rid} (prompt {n})")
            added += 1
            continue
        if not sched.has_unfinished():
            continue
        decodes = [r for r in prompt_len if computed[r] == prompt_len[r]]
        prefills = [(r, computed[r], n) for r, n in prompt_len.items() if computed[r] < n]
        assert len(decodes) <= budget  # at most `budget` requests: the rules agree here
        out = sched.schedule()
        want = ([s.group.request_id for s in out.decodes],
                [(c.seq.group.request_id, c.start, c.end) for c in out.prefills])
        inputs = dict(token_budget=budget, decodes=decodes, prefills=prefills,
                      recent_events=log[-6:])
        _same_plan(m, decodes, prefills, budget, want,
                   f"differs from minipaged's Scheduler at step {steps}", inputs)
        for c in out.prefills:
            computed[c.seq.group.request_id] = c.end
        finished = sched.update(out, StepResult(0.0, [7] * len(out.sampled)), float(steps))
        for g in finished:
            del prompt_len[g.request_id], computed[g.request_id]
        log.append(f"step {steps}: decodes {want[0]}, chunks {want[1]}")
        steps += 1
    return steps


@EX_14.case("replayed against minipaged's Scheduler (chunked_prefill=True)",
            hint="the scheduler runs exactly these rules each step: your plan must be its plan "
                 "for the requests it holds")
def _scheduler(m):
    rng = np.random.default_rng(1415)
    for _ in range(12):
        budget = int(rng.choice([4, 7, 16, 33]))
        steps = _replay(m, rng, budget, min(budget, int(rng.integers(2, 9))),
                        int(rng.choice([1, 4, 16])))
        expect(steps > 0, "the replay ran no step", hint="(a grader problem, not yours)")


class _Untouchable:
    """Raises on any use: a call that checks token_budget first never touches it."""

    def _fail(self, *args):
        raise RuntimeError("decodes / prefills were used before token_budget was checked")

    __iter__ = __len__ = __getitem__ = __bool__ = _fail


@EX_14.case("bad input is rejected before anything is planned",
            hint="check token_budget first, then every prefill's num_computed and that no "
                 "request id appears twice; never modify the inputs")
def _errors(m):
    for bad in (0, -1, 2.5, None):
        rejects(lambda bad=bad: m.schedule_step(_Untouchable(), _Untouchable(), bad),
                ValueError, f"token_budget={bad!r} must be rejected before decodes and "
                "prefills are looked at", dict(token_budget=bad),
                hint="the first line of schedule_step checks token_budget: an int >= 1")
    cases = (
        (["A"], [("L", 5, 5)], 8, "num_computed == prompt_len: that prompt is done"),
        (["A"], [("L", -1, 5)], 8, "num_computed < 0"),
        (["A"], [("L", 7, 5)], 8, "num_computed > prompt_len"),
        (["A"], [("A", 0, 5)], 8, "A both decodes and prefills"),
        (["A", "A"], [], 8, "A decodes twice"),
        ([], [("L", 0, 4), ("L", 1, 4)], 8, "L prefills twice"),
    )
    for decodes, prefills, budget, what in cases:
        snapshot = lambda d=decodes, p=prefills: copy.deepcopy((d, p))  # noqa: E731
        rejects(lambda d=decodes, p=prefills, b=budget: m.schedule_step(d, p, b), ValueError,
                f"{what}: must raise ValueError", dict(decodes=decodes, prefills=prefills,
                                                       token_budget=budget), state=snapshot)


@EX_14.case("prefill_steps: steps to a first token beside running decodes",
            hint="each step the prompt gets token_budget - num_decodes tokens; round up")
def _steps(m):
    rng = np.random.default_rng(1416)
    cases = []
    for _ in range(200):
        budget = int(rng.choice([1, 2, 8, 64, 512, 2048]))
        nd = int(rng.integers(0, budget))
        cases.append((int(rng.integers(1, 5000)), nd, budget))
    agree(m.prefill_steps, lambda n, nd, budget: cdiv(n, budget - nd), cases,
          "wrong number of steps")
    for args, what in (((10, 8, 8), "num_decodes == token_budget"),
                       ((10, 9, 8), "num_decodes > token_budget"),
                       ((0, 1, 8), "prompt_len 0"), ((10, -1, 8), "num_decodes < 0"),
                       ((10, 0, 0), "token_budget 0")):
        rejects(lambda a=args: m.prefill_steps(*a), ValueError, f"{what} must be rejected",
                dict(zip(("prompt_len", "num_decodes", "token_budget"), args)),
                hint="with no token left for the prompt it would wait forever: say so with "
                     "ValueError")


@EX_14.case("prefill_steps agrees with your own schedule_step, step after step",
            hint="run schedule_step on one prompt plus num_decodes decodes until the prompt "
                 "is done: that count is prefill_steps")
def _consistent(m):
    rng = np.random.default_rng(1417)
    for _ in range(40):
        budget = int(rng.choice([2, 5, 16]))
        nd, n = int(rng.integers(0, budget)), int(rng.integers(1, 80))
        decodes = [f"d{i}" for i in range(nd)]
        done, steps = 0, 0
        while done < n:
            _, chunks = _normalize(m.schedule_step(decodes, [("P", done, n)], budget))
            expect(len(chunks) == 1 and chunks[0][1] == done and chunks[0][2] > done,
                   "the prompt must advance every step", inputs=dict(
                       decodes=decodes, prefills=[("P", done, n)], token_budget=budget),
                   expected=f"one chunk starting at {done}", got=chunks,
                   hint="with num_decodes < token_budget some budget is left for the prompt")
            done, steps = chunks[0][2], steps + 1
        equal(m.prefill_steps(n, nd, budget), steps, "prefill_steps disagrees with the steps "
              "your schedule_step took", dict(prompt_len=n, num_decodes=nd,
                                              token_budget=budget))
