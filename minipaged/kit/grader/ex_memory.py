"""Hidden cases for exercises 01 (KV bytes and slots) and 02 (contiguous reservation waste).

References are the plain formulas of lesson 01 / 02, written again here so that a learner's
file is never compared with itself.
"""

from __future__ import annotations

import numpy as np

from minipaged.kit.grader.core import Exercise, expect, expect_raises

EX_01 = Exercise(
    "01_kv_bytes", "bytes of KV per token and token slots per GPU",
    ("kv_bytes_per_token", "num_token_slots", "num_blocks"),
    hint="2 (K and V) x layers x KV heads x head size x bytes per element; then integer "
         "division (//) by the bytes per token, and by the block size for blocks.")

# (name, layers, kv_heads, head_size, bytes): the models the lessons use.
MODELS = [
    ("OPT-13B fp16 (the paper)", 40, 40, 128, 2),
    ("Llama-3-8B fp16 (GQA, 8 KV heads)", 32, 8, 128, 2),
    ("Llama-2-70B fp16 (GQA)", 80, 8, 128, 2),
    ("a tiny model in fp32", 2, 1, 16, 4),
]


@EX_01.case("bytes per token of real models")
def _kv_models(m):
    for name, L, hkv, d, b in MODELS:
        want = 2 * L * hkv * d * b
        got = m.kv_bytes_per_token(L, hkv, d, b)
        expect(got == want, f"wrong bytes per token for {name}",
               inputs=dict(num_layers=L, num_kv_heads=hkv, head_size=d, bytes_per_element=b),
               expected=want, got=got)


@EX_01.case("OPT-13B on 12 GiB: the paper's ~15.7K slots")
def _opt_slots(m):
    per = 2 * 40 * 40 * 128 * 2
    kv = 12 * 1024**3
    got = m.num_token_slots(kv, per)
    expect(got == kv // per, "wrong number of token slots",
           inputs=dict(kv_cache_bytes=kv, bytes_per_token=per), expected=kv // per, got=got)


@EX_01.case("slots and blocks on random budgets (integer exact)")
def _random_slots(m):
    rng = np.random.default_rng(1)
    for _ in range(200):
        per = int(rng.integers(1, 2_000_000))
        kv = int(rng.integers(0, 2**46))
        bs = int(rng.choice([1, 8, 16, 32, 256]))
        inputs = dict(kv_cache_bytes=kv, bytes_per_token=per, block_size=bs)
        got = m.num_token_slots(kv, per)
        expect(got == kv // per, "wrong num_token_slots", inputs=inputs, expected=kv // per,
               got=got)
        got = m.num_blocks(kv, per, bs)
        expect(got == kv // (per * bs), "wrong num_blocks", inputs=inputs,
               expected=kv // (per * bs), got=got)


@EX_01.case("bad arguments raise ValueError")
def _bad_kv(m):
    expect_raises(lambda: m.kv_bytes_per_token(0, 8, 128, 2), ValueError,
                  "num_layers=0 must be rejected", inputs=dict(num_layers=0))
    expect_raises(lambda: m.kv_bytes_per_token(32, 8, -128, 2), ValueError,
                  "head_size=-128 must be rejected", inputs=dict(head_size=-128))
    expect_raises(lambda: m.num_token_slots(10**9, 0), ValueError,
                  "bytes_per_token=0 must be rejected", inputs=dict(bytes_per_token=0))
    expect_raises(lambda: m.num_blocks(10**9, 1000, 0), ValueError,
                  "block_size=0 must be rejected", inputs=dict(block_size=0))


EX_02 = Exercise(
    "02_contiguous_waste", "contiguous reservation waste (the paper's Fig. 2 categories)",
    ("reservation_size", "contiguous_breakdown", "paged_breakdown"),
    hint="token = current_len; reserved = final_len - current_len; internal fragmentation = "
         "what is held beyond final_len (the reservation, or the last block's tail).")


def _ref_size(policy: str, final_len: int, max_seq_len: int) -> int:
    return {"max": max_seq_len, "oracle": final_len,
            "pow2": min(1 << (final_len - 1).bit_length(), max_seq_len)}[policy]


@EX_02.case("reservation sizes for the three policies")
def _sizes(m):
    for policy in ("max", "pow2", "oracle"):
        for final_len in (1, 2, 3, 17, 64, 65, 500, 1024, 1025, 2047, 2048):
            want = _ref_size(policy, final_len, 2048)
            got = m.reservation_size(policy, final_len, 2048)
            expect(got == want, f"wrong reservation for policy {policy!r}",
                   inputs=dict(policy=policy, final_len=final_len, max_seq_len=2048),
                   expected=want, got=got)
    got = m.reservation_size("pow2", 1500, 1800)
    expect(got == 1800, "pow2 must be capped at max_seq_len",
           inputs=dict(policy="pow2", final_len=1500, max_seq_len=1800), expected=1800, got=got)


@EX_02.case("contiguous breakdown adds up, on random requests")
def _contig(m):
    rng = np.random.default_rng(2)
    for _ in range(300):
        final_len = int(rng.integers(1, 2049))
        current = int(rng.integers(1, final_len + 1))
        policy = str(rng.choice(["max", "pow2", "oracle"]))
        size = _ref_size(policy, final_len, 2048)
        want = {"token": current, "reserved": final_len - current,
                "internal_fragmentation": size - final_len}
        got = m.contiguous_breakdown(policy, current, final_len, 2048)
        expect(dict(got) == want, "wrong contiguous breakdown",
               inputs=dict(policy=policy, current_len=current, final_len=final_len,
                           max_seq_len=2048), expected=want, got=got)


@EX_02.case("paged breakdown: waste below one block")
def _paged(m):
    rng = np.random.default_rng(3)
    for _ in range(300):
        final_len = int(rng.integers(1, 3000))
        current = int(rng.integers(1, final_len + 1))
        bs = int(rng.choice([1, 2, 8, 16, 32, 128]))
        alloc = -(-current // bs) * bs
        want = {"token": current, "reserved": min(alloc, final_len) - current,
                "internal_fragmentation": alloc - min(alloc, final_len)}
        got = m.paged_breakdown(current, final_len, bs)
        expect(dict(got) == want, "wrong paged breakdown",
               inputs=dict(current_len=current, final_len=final_len, block_size=bs),
               expected=want, got=got)


@EX_02.case("bad arguments raise ValueError")
def _bad_policy(m):
    expect_raises(lambda: m.reservation_size("buddy", 10, 2048), ValueError,
                  "an unknown policy must be rejected", inputs=dict(policy="buddy"))
    expect_raises(lambda: m.reservation_size("max", 4096, 2048), ValueError,
                  "final_len > max_seq_len must be rejected",
                  inputs=dict(final_len=4096, max_seq_len=2048))
    expect_raises(lambda: m.contiguous_breakdown("oracle", 20, 10, 2048), ValueError,
                  "current_len > final_len must be rejected",
                  inputs=dict(current_len=20, final_len=10))
    expect_raises(lambda: m.paged_breakdown(5, 10, 0), ValueError,
                  "block_size=0 must be rejected", inputs=dict(block_size=0))
