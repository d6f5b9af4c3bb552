"""Hidden cases for exercises 01 (KV bytes and slots) and 02 (contiguous reservation waste).

References are the plain formulas of lessons 01 and 02, written again here so that a learner's
file is never compared with itself.
"""

from __future__ import annotations

import numbers

import numpy as np

from minipaged._checks import cdiv
from minipaged.kit.grader.core import Exercise, agree, expect, rejects

EX_01 = Exercise("01_kv_bytes", "bytes of KV per token and token slots per GPU",
                 ("kv_bytes_per_token", "num_token_slots", "num_blocks"))

# The models the lessons use: (layers, KV heads, head size, bytes per element).
MODELS = {"OPT-13B fp16 (the paper)": (40, 40, 128, 2),
          "Llama-3-8B fp16 (GQA, 8 KV heads)": (32, 8, 128, 2),
          "Llama-2-70B fp16 (GQA)": (80, 8, 128, 2),
          "a tiny model in fp32": (2, 1, 16, 4)}


def _ref_bytes(layers, kv_heads, head_size, elem_bytes):
    return 2 * layers * kv_heads * head_size * elem_bytes


@EX_01.case("bytes per token of real models",
            hint="every layer keeps a K and a V vector per KV head: count all four factors "
                 "and the 2")
def _kv_models(m):
    for name, args in MODELS.items():
        agree(m.kv_bytes_per_token, _ref_bytes, [args], f"wrong bytes per token for {name}")


@EX_01.case("OPT-13B on 12 GiB: the paper's ~15.7K slots (Table 1)",
            hint="a slot holds one whole token, so only whole tokens count: integer division")
def _opt_slots(m):
    per_token = _ref_bytes(*MODELS["OPT-13B fp16 (the paper)"])
    agree(m.num_token_slots, lambda kv, per: kv // per, [(12 * 1024**3, per_token)],
          "wrong number of token slots")


@EX_01.case("slots and blocks on random budgets (integer exact)",
            hint="a block is block_size slots; a partial block cannot be used; a budget of 0 "
                 "bytes holds 0 of them (only a negative budget is an error)")
def _random_slots(m):
    rng = np.random.default_rng(1)
    budgets = [(0, 1000, 16)] + [(int(rng.integers(0, 2**46)), int(rng.integers(1, 2_000_000)),
                                  int(rng.choice([1, 8, 16, 32, 256]))) for _ in range(200)]
    agree(m.num_token_slots, lambda kv, per: kv // per, [b[:2] for b in budgets],
          "wrong num_token_slots")
    agree(m.num_blocks, lambda kv, per, bs: kv // (per * bs), budgets, "wrong num_blocks")


@EX_01.case("results are ints, exact beyond 2**53 bytes",
            hint="a float is not an int, even when it equals one: keep to integer operations")
def _ints(m):
    # 2**60 - 1 bytes / 2**17 B per token: float(2**60 - 1) is 2**60, one token (or block) more
    huge, why = (2**60 - 1, 2**17), "floats hold every integer only up to 2**53: divide with //"
    agree(m.num_token_slots, lambda kv, per: kv // per, [huge], "wrong slots for 2**60 - 1 bytes",
          hint=why)
    agree(m.num_blocks, lambda kv, per, bs: kv // (per * bs), [(*huge, 16)],
          "wrong blocks for 2**60 - 1 bytes", hint=why)
    for fn, args in ((m.kv_bytes_per_token, (40, 40, 128, 2)), (m.num_token_slots, huge),
                     (m.num_blocks, (*huge, 16))):
        got = fn(*args)
        expect(isinstance(got, numbers.Integral) and not isinstance(got, bool),
               f"{fn.__name__} must return an int", inputs=f"{fn.__name__}{args}",
               expected="an int", got=f"{type(got).__name__} {got!r}")


@EX_01.case("bad arguments raise ValueError",
            hint="sizes and counts below 1 describe no model: reject them with ValueError")
def _bad_kv(m):
    names = ("num_layers", "num_kv_heads", "head_size", "bytes_per_element")
    # each argument at 0 and below it: "== 0" is not "< 1"
    sizes = [(lambda a=a: m.kv_bytes_per_token(*a), f"{names[i]}={bad}")
             for i in range(4) for bad in (0, -8)
             for a in [(32, 8, 128, 2)[:i] + (bad,) + (32, 8, 128, 2)[i + 1:]]]
    for call, what in (*sizes,
                       (lambda: m.num_token_slots(-1, 1000), "kv_cache_bytes=-1"),
                       (lambda: m.num_token_slots(10**9, 0), "bytes_per_token=0"),
                       (lambda: m.num_token_slots(10**9, -1000), "bytes_per_token=-1000"),
                       (lambda: m.num_blocks(-1, 1000, 16), "kv_cache_bytes=-1 (num_blocks)"),
                       (lambda: m.num_blocks(10**9, -1000, 16),
                        "bytes_per_token=-1000 (num_blocks)"),
                       (lambda: m.num_blocks(10**9, 1000, 0), "block_size=0")):
        rejects(call, ValueError, f"{what} must be rejected", what,
                hint="a budget of 0 bytes holds nothing, but a negative one is a mistake"
                if what.startswith("kv_cache_bytes") else "")


EX_02 = Exercise("02_contiguous_waste",
                 "contiguous reservation waste (the paper's Fig. 2 categories)",
                 ("reservation_size", "contiguous_breakdown", "paged_breakdown"))


def _ref_size(policy, prompt_len, final_len, max_seq_len):
    # pow2: the prompt plus the output rounded up to a power of two (paper section 6.1)
    out = final_len - prompt_len
    return {"max": max_seq_len, "oracle": final_len,
            "pow2": min(prompt_len + (1 << (out - 1).bit_length() if out else 0),
                        max_seq_len)}[policy]


def _ref_contiguous(policy, prompt, current, final_len, max_seq_len):
    size = _ref_size(policy, prompt, final_len, max_seq_len)
    return {"token": current, "reserved": final_len - current,
            "internal_fragmentation": size - final_len}


def _ref_paged(current_len, final_len, block_size):
    held = cdiv(current_len, block_size) * block_size
    return {"token": current_len, "reserved": min(held, final_len) - current_len,
            "internal_fragmentation": held - min(held, final_len)}


@EX_02.case("reservation sizes for the three policies",
            hint="pow2 rounds only the output (final_len - prompt_len) up to a power of two, "
                 "adds the prompt, and never goes beyond max_seq_len")
def _sizes(m):
    for policy in ("max", "pow2", "oracle"):
        agree(m.reservation_size, _ref_size, [(policy, p, f, 2048) for p, f in (
            (1, 1), (1, 2), (2, 3), (9, 17), (32, 64), (1, 65), (100, 125), (12, 500),
            (500, 1024), (1, 1025), (1000, 2047), (2048, 2048))],
              f"wrong reservation for policy {policy!r}")
    # Three slips, each with its own message: 100 + 32 = 132; 500 + 1024 = 1524; capped at 1500.
    for args, why in (
            (("pow2", 100, 125, 2048),
             "the paper's example: an output of 25 reserves 32, plus the prompt of 100"),
            (("pow2", 500, 1500, 1800),
             "pow2 rounds the output (1000 -> 1024), not the final length (1500 -> 2048)"),
            (("pow2", 100, 1500, 1500), "pow2 must be capped at max_seq_len"),
            (("max", 100, 125, 4096), "max reserves max_seq_len slots, whatever it is")):
        agree(m.reservation_size, _ref_size, [args], why)


@EX_02.case("contiguous breakdown adds up, on random requests",
            hint="token, reserved and internal fragmentation are the gaps between current "
                 "length, final length and the reservation")
def _contig(m):
    rng = np.random.default_rng(2)
    cases = []
    for _ in range(300):
        final_len = int(rng.integers(1, 2049))
        prompt = int(rng.integers(1, final_len + 1))
        current = int(rng.integers(prompt, final_len + 1))
        cases.append((str(rng.choice(["max", "pow2", "oracle"])), prompt, current, final_len,
                      2048))
    agree(m.contiguous_breakdown, _ref_contiguous, cases, "wrong contiguous breakdown",
          convert=dict)


@EX_02.case("paged breakdown: waste below one block",
            hint="a paged cache holds only the blocks its current tokens need; of their "
                 "unfilled slots, those up to final_len are reserved")
def _paged(m):
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(300):
        final_len = int(rng.integers(1, 3000))
        cases.append((int(rng.integers(1, final_len + 1)), final_len,
                      int(rng.choice([1, 2, 8, 16, 32, 128]))))
    agree(m.paged_breakdown, _ref_paged, cases, "wrong paged breakdown", convert=dict)


@EX_02.case("bad arguments raise ValueError",
            hint="validate the policy name and the lengths before computing anything")
def _bad_policy(m):
    for call, what in ((lambda: m.reservation_size("buddy", 5, 10, 2048), "policy='buddy'"),
                       *[(lambda p=p: m.reservation_size(p, 10, 4096, 2048),
                          f"final_len=4096 > max_seq_len=2048 (policy {p!r})")
                         for p in ("max", "pow2", "oracle")],
                       (lambda: m.contiguous_breakdown("buddy", 5, 5, 10, 2048),
                        "contiguous_breakdown's policy='buddy'"),
                       (lambda: m.contiguous_breakdown("oracle", 5, 5, 4096, 2048),
                        "contiguous_breakdown's final_len=4096 > max_seq_len=2048"),
                       (lambda: m.reservation_size("pow2", 20, 10, 2048),
                        "prompt_len=20 > final_len=10"),
                       (lambda: m.reservation_size("oracle", 0, 10, 2048), "prompt_len=0"),
                       (lambda: m.contiguous_breakdown("oracle", 5, 20, 10, 2048),
                        "current_len=20 > final_len=10"),
                       (lambda: m.contiguous_breakdown("max", 10, 5, 20, 2048),
                        "current_len=5 < prompt_len=10"),
                       (lambda: m.paged_breakdown(20, 10, 16),
                        "paged_breakdown's current_len=20 > final_len=10"),
                       (lambda: m.paged_breakdown(0, 10, 16), "paged_breakdown's current_len=0"),
                       (lambda: m.paged_breakdown(5, 10, 0), "block_size=0")):
        rejects(call, ValueError, f"{what} must be rejected", what)
