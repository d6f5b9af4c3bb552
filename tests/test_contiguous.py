"""The contiguous KV cache: policies, K/V read-back, the four categories, and every bad input."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from invariants import check_invariants

from minipaged import ContiguousKVCache
from minipaged.contiguous.buddy import next_pow2
from minipaged.contiguous.cache import OutOfMemoryError
from minipaged.contiguous.usage import CATEGORIES, KVUsage
from minipaged.paged.block_allocator import OutOfBlocksError

HKV, D = 2, 4


def usage_by_slot(c: ContiguousKVCache, need: int | None = None) -> KVUsage:
    """The oracle for ``usage``: the definition slot by slot. Each slot of the arena is painted
    with its category (a request's slots: n token, then F - n reserved, then H - F internal; a
    free block's slots: free if the block could hold a region of ``need``, else external)."""
    need = c.max_seq_len if need is None else need
    paint = np.full(c.num_slots, "", dtype=object)
    for sid in c.seq_ids:
        r = c.reservation(sid)
        paint[r.offset:r.offset + r.num_tokens] = "token"
        paint[r.offset + r.num_tokens:r.offset + r.final_len] = "reserved"
        paint[r.offset + r.final_len:r.offset + r.held] = "internal_fragmentation"
    for off, n in c.allocator.free_blocks():
        paint[off:off + n] = "free" if n >= next_pow2(need) else "external_fragmentation"
    assert (paint != "").all(), "a slot is neither held nor free"
    return KVUsage(total=c.num_slots, **{cat: int((paint == cat).sum()) for cat in CATEGORIES})


def kv_data(rng: np.random.Generator, t: int, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    return (rng.standard_normal((t, HKV, D)).astype(dtype),  # [T, Hkv, D]
            rng.standard_normal((t, HKV, D)).astype(dtype))


# ---- policies and accounting, small enough to check by hand -------------------------------------

@pytest.mark.parametrize("policy, want", [("max", 256), ("pow2", 132), ("oracle", 125)])
def test_policy_reservation_size(policy, want):
    # The paper's Orca (Pow2) example (section 6.1): an output of 25 reserves 32 positions for
    # outputs; with a prompt of 100, that is 132 slots.
    c = ContiguousKVCache(1024, HKV, D, policy=policy, max_seq_len=256)
    assert c.reservation_size(100, 125) == want
    off = c.reserve("a", 100, 125)
    assert c.reservation("a").size == want and c.reservation("a").held == want
    assert c.num_free == 1024 - want and off == 0


def test_pow2_rounds_the_output_only_and_is_capped_at_max_seq_len():
    c = ContiguousKVCache(4096, HKV, D, policy="pow2", max_seq_len=3000)
    assert c.reservation_size(1000, 2100) == 3000  # 1000 + 2048, capped at max_seq_len
    assert c.reservation_size(100, 1500) == 2148  # 100 + next_pow2(1400)
    assert c.reservation_size(500, 1500) == 1524  # 500 + next_pow2(1000): not next_pow2(1500)
    assert c.reservation_size(7, 7) == 7  # no output token to reserve for
    assert c.reservation_size(1, 2) == 2  # one output token: next_pow2(1) = 1


@given(prompt=st.integers(1, 2048), output=st.integers(0, 2048))
def test_pow2_over_reserves_the_output_by_less_than_2x(prompt, output):
    """Against the paper's wording (section 6.1: "over-reserves the space for outputs by at
    most 2x"): the reservation is prompt + a power of two in [output, 2 * output), capped."""
    c = ContiguousKVCache(8192, 1, 1, policy="pow2", max_seq_len=4096, store_kv=False)
    final = prompt + output
    if final > 4096:
        with pytest.raises(ValueError, match="final_len"):
            c.reservation_size(prompt, final)
        return
    r = c.reservation_size(prompt, final)
    extra = r - prompt  # what is reserved for the output
    assert final <= r <= 4096
    assert r == 4096 or (extra & (extra - 1) == 0 and output <= extra < max(2 * output, 1))


def test_usage_categories_by_hand():
    c = ContiguousKVCache(1024, HKV, D, policy="pow2", max_seq_len=256, store_kv=False)
    c.reserve("a", 64, 100)  # 64 + next_pow2(36) = 128 slots at [0, 128)
    c.advance("a", 30)
    u = c.usage()
    assert (u.token, u.reserved, u.internal_fragmentation) == (30, 70, 28)
    # free blocks: 128 @128, 256 @256, 512 @512; a max-length (256) region fits in two of them
    assert (u.external_fragmentation, u.free) == (128, 768)
    assert c.usage(need=100) == KVUsage(1024, 30, 70, 28, 0, 896)  # a 128-block serves 100
    assert c.usage(need=1024).external_fragmentation == 896  # nothing serves 1024 now


def test_empty_arena_not_a_power_of_two_has_external_fragmentation():
    # 15,728 = 8192 + 4096 + 2048 + (1024 + 256 + 64 + 32 + 16): the last 1392 slots are in
    # blocks too small for a 2048-slot region, even with nothing allocated
    c = ContiguousKVCache(15728, 1, 1, max_seq_len=2048, store_kv=False)
    assert c.usage() == KVUsage(15728, 0, 0, 0, 1392, 14336)
    assert c.usage(need=16).external_fragmentation == 0


def test_rounding_slack_is_reported_apart_from_the_policy():
    c = ContiguousKVCache(1024, HKV, D, policy="oracle", max_seq_len=256, exact_fit=False)
    c.reserve("a", 10, 100)
    b = c.breakdown()
    assert (b["internal_policy"], b["internal_rounding"]) == (0, 28)  # 100 asked, 128 held
    assert c.usage().internal_fragmentation == 28
    assert sum(b.values()) == 1024


def test_max_policy_internal_fragmentation_is_the_unused_tail():
    c = ContiguousKVCache(1024, HKV, D, policy="max", max_seq_len=256)
    c.reserve("a", 10, 100)
    b = c.breakdown()
    assert (b["internal_policy"], b["internal_rounding"]) == (156, 0)


def test_written_kv_comes_back_exactly_and_views_are_read_only():
    rng = np.random.default_rng(0)
    c = ContiguousKVCache(256, HKV, D, policy="oracle", max_seq_len=64, dtype=np.float16)
    c.reserve(1, 5, 20)
    k1, v1 = kv_data(rng, 5, np.float16)
    k2, v2 = kv_data(rng, 3, np.float16)
    c.write(1, k1, v1)
    c.write(1, k2, v2)
    k, v = c.kv(1)
    assert k.shape == (8, HKV, D) and k.dtype == np.float16
    assert np.array_equal(k, np.concatenate([k1, k2]))
    assert np.array_equal(v, np.concatenate([v1, v2]))
    with pytest.raises(ValueError):
        k[0, 0, 0] = 1
    assert np.shares_memory(k, c.key_arena)  # a view: no gather, which contiguity buys


@pytest.mark.skipif(importlib.util.find_spec("minipaged.attention") is None,
                    reason="minipaged.attention is not written yet")
def test_dense_attention_reads_the_cache():
    from minipaged.attention import dense_attention

    rng = np.random.default_rng(1)
    c = ContiguousKVCache(128, HKV, D, policy="pow2", max_seq_len=32)
    c.reserve("x", 6, 9)
    c.reserve("y", 3, 4)
    kx, vx = kv_data(rng, 7)
    c.write("x", kx, vx)
    c.write("y", *kv_data(rng, 2))
    q = rng.standard_normal((1, 4, D)).astype(np.float32)  # [T=1, H=4, D], GQA 2 heads per KV
    # Same arithmetic on the same numbers: equal bit for bit
    assert np.array_equal(dense_attention(q, *c.kv("x")), dense_attention(q, kx, vx))


def test_release_everything_restores_the_arena():
    c = ContiguousKVCache(1000, HKV, D, policy="oracle", max_seq_len=200)
    for i, f in enumerate([37, 200, 5, 64, 99]):
        c.reserve(i, 1, f)
    for i in (3, 0, 4, 1, 2):
        c.release(i)
    assert c.allocator.free_blocks() == [(0, 512), (512, 256), (768, 128), (896, 64), (960, 32),
                                         (992, 8)]
    assert c.usage() == usage_by_slot(c)


# ---- bad inputs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(policy="lru"), ValueError, "policy='lru' is not one of"),
    (dict(max_seq_len=2000), ValueError, r"max_seq_len=2000 is out of range: expected in \[1, 10"),
    (dict(max_seq_len=600), ValueError, "cannot place even one max_seq_len=600.*1024.*512"),
    (dict(max_seq_len=0), ValueError, "max_seq_len=0"),
    (dict(dtype=np.int32, max_seq_len=8), TypeError, "dtype=int32 is not supported; expected"),
    (dict(dtype="foo", max_seq_len=8), TypeError, "dtype='foo' is not supported"),  # unnamed
    (dict(dtype=None, max_seq_len=8), TypeError, "dtype=None is not supported"),  # was float64
    (dict(exact_fit="no", max_seq_len=8), TypeError, "exact_fit='no' must be a bool"),  # was True
    (dict(store_kv=None, max_seq_len=8), TypeError, "store_kv=None must be a bool"),  # was False
])
def test_bad_constructor_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ContiguousKVCache(1000, HKV, D, **kwargs)


@pytest.mark.parametrize("name, args", [("num_kv_heads", (16, 0, 4)), ("head_size", (16, 2, -1)),
                                        ("num_slots", (0, 2, 4)), ("num_slots", (10**10, 2, 8)),
                                        ("num_slots", (10**30, 2, 8))])
def test_bad_sizes(name, args):
    # 10**10 slots was a MemoryError allocating the arena, 10**30 numpy's "Maximum allowed
    # dimension exceeded": slot offsets are int32 (< 2**31), checked before anything is made.
    with pytest.raises(ValueError, match=name):
        ContiguousKVCache(*args, max_seq_len=1, store_kv=args[0] < 2**31)


@pytest.fixture
def cache():
    c = ContiguousKVCache(256, HKV, D, policy="oracle", max_seq_len=64)
    c.reserve("a", 4, 10)
    return c


def test_reserve_duplicate_seq_id(cache):
    with pytest.raises(ValueError, match="seq_id='a' already holds a reservation"):
        cache.reserve("a", 1, 2)


def test_reserve_refuses_an_id_that_could_not_be_found_again(cache):
    """A list was a bare "unhashable type"; True would be request 1, a NaN never found."""
    before = (cache.seq_ids, cache.num_free, cache.breakdown())
    for bad, err, match in ((["b"], TypeError, r"seq_id=\['b'\] must be hashable"),
                            (True, TypeError, "seq_id=True must not be a bool"),
                            (float("nan"), ValueError, "seq_id=nan is not equal to itself")):
        with pytest.raises(err, match=match):
            cache.reserve(bad, 4, 8)
    assert (cache.seq_ids, cache.num_free, cache.breakdown()) == before
    for call in (cache.release, cache.kv, cache.seq_len, cache.reservation):
        with pytest.raises(TypeError, match=r"seq_id=\['b'\] must be hashable"):
            call(["b"])
    assert (cache.seq_ids, cache.num_free, cache.breakdown()) == before


@pytest.mark.parametrize("prompt_len, final_len, match", [
    (5, 4, r"prompt_len=5 is out of range: expected in \[1, 5\)"),
    (0, 4, "prompt_len=0"),
    (1, 65, r"final_len=65 is out of range: expected in \[1, 65\)"),
    (1, 0, "final_len=0"),
])
def test_reserve_bad_lengths(cache, prompt_len, final_len, match):
    with pytest.raises(ValueError, match=match):
        cache.reserve("b", prompt_len, final_len)
    with pytest.raises(ValueError, match=match):
        cache.can_reserve(prompt_len, final_len)


def test_reserve_non_int_length(cache):
    with pytest.raises(TypeError, match=r"final_len=.* must be an integer"):
        cache.reserve("b", 1, 3.0)


def test_out_of_memory_names_needed_and_largest_free_and_changes_nothing():
    c = ContiguousKVCache(256, HKV, D, policy="oracle", max_seq_len=128)
    c.reserve(0, 1, 128)
    c.reserve(1, 1, 64)
    before = (c.usage(), c.allocator.free_blocks(), c.seq_ids)
    assert not c.can_reserve(1, 100)
    with pytest.raises(OutOfMemoryError) as e:
        c.reserve(2, 1, 100)
    assert (e.value.needed, e.value.largest_free, e.value.num_free) == (100, 64, 64)
    assert "seq_id=2" in str(e.value) and "needed 100" in str(e.value)
    assert isinstance(e.value, OutOfBlocksError) and e.value.free == 64
    assert (c.usage(), c.allocator.free_blocks(), c.seq_ids) == before


def test_write_unknown_seq(cache):
    with pytest.raises(ValueError, match="unknown seq_id='zz'"):
        cache.write("zz", *kv_data(np.random.default_rng(0), 1))


def test_write_wrong_shape(cache):
    k = np.zeros((2, HKV + 1, D), np.float32)
    with pytest.raises(ValueError, match=r"key.shape=\(2, 3, 4\), expected \[T, Hkv, D\]"):
        cache.write("a", k, k)


def test_write_wrong_dtype(cache):
    k = np.zeros((2, HKV, D), np.float64)
    with pytest.raises(TypeError, match="key.dtype=float64 but the cache stores float32"):
        cache.write("a", k, k)


def test_write_not_an_array(cache):
    with pytest.raises(TypeError, match="key must be a numpy array"):
        cache.write("a", [[[0.0]]], np.zeros((1, HKV, D), np.float32))


def test_write_key_value_length_mismatch(cache):
    k, _ = kv_data(np.random.default_rng(0), 3)
    _, v = kv_data(np.random.default_rng(0), 2)
    with pytest.raises(ValueError, match="key has T=3 tokens but value has T=2"):
        cache.write("a", k, v)


def test_write_beyond_final_len_changes_nothing(cache):
    cache.write("a", *kv_data(np.random.default_rng(0), 8))
    before = cache.kv("a")[0].copy()
    with pytest.raises(ValueError, match="would make 11 tokens, beyond its final_len=10"):
        cache.write("a", *kv_data(np.random.default_rng(1), 3))
    assert cache.seq_len("a") == 8 and np.array_equal(cache.kv("a")[0], before)


def test_advance_needs_accounting_only_cache(cache):
    with pytest.raises(ValueError, match="advance\\(\\) is for store_kv=False"):
        cache.advance("a", 1)


def test_write_and_kv_need_storage():
    c = ContiguousKVCache(64, HKV, D, max_seq_len=8, store_kv=False)
    c.reserve(0, 1, 4)
    with pytest.raises(ValueError, match="write\\(\\) needs store_kv=True"):
        c.write(0, *kv_data(np.random.default_rng(0), 1))
    with pytest.raises(ValueError, match="kv\\(\\) needs store_kv=True"):
        c.kv(0)
    with pytest.raises(ValueError, match="num_tokens=-1"):
        c.advance(0, -1)


def test_release_twice(cache):
    cache.release("a")
    with pytest.raises(ValueError, match="unknown seq_id='a'"):
        cache.release("a")


@pytest.mark.parametrize("need", [0, 257])
def test_usage_bad_need(cache, need):
    with pytest.raises(ValueError, match=f"need={need}"):
        cache.usage(need=need)
    with pytest.raises(ValueError, match=f"need={need}"):
        cache.breakdown(need=need)


@pytest.mark.parametrize("need", [7.5, "3", True])
def test_usage_need_of_the_wrong_type(cache, need):
    for count in (cache.usage, cache.breakdown):
        with pytest.raises(TypeError, match=f"need={need!r} must be an integer"):
            count(need)


# ---- stateful model -----------------------------------------------------------------------------

class CacheMachine(RuleBasedStateMachine):
    """Reserve / write / release at random, any policy, with and without exact fit.

    Invariants (prose; each asserted below after every step):
      - no two reservations overlap; each holds at least its policy's size;
      - free + allocated = total: num_free + sum(held) == num_slots;
      - the usage categories add up to num_slots (KVUsage checks it) and agree with the
        definition painted slot by slot (usage_by_slot), for several region sizes ``need``;
      - token = tokens written, reserved = sum(final_len - tokens), both >= 0;
      - the K/V of every live request read back exactly as written: an operation on one
        request never changes another's;
      - reserve fails exactly when can_reserve says so, and then changes nothing;
      - releasing everything restores the arena's starting free blocks.
    """

    @initialize(num_slots=st.integers(32, 700), policy=st.sampled_from(["max", "pow2", "oracle"]),
                exact=st.booleans(), msl_frac=st.floats(0.05, 1.0))
    def setup(self, num_slots, policy, exact, msl_frac):
        largest = 1 << (num_slots.bit_length() - 1)
        self.msl = max(1, int(msl_frac * largest))
        self.c = ContiguousKVCache(num_slots, HKV, D, policy=policy, max_seq_len=self.msl,
                                   exact_fit=exact)
        self.expect: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.next_id = 0
        self.rng = np.random.default_rng(num_slots)

    @rule(f=st.floats(0, 1), p=st.floats(0, 1))
    def reserve(self, f, p):
        final = 1 + int(f * (self.msl - 1))
        prompt = 1 + int(p * (final - 1))
        sid = self.next_id
        self.next_id += 1
        if self.c.can_reserve(prompt, final):
            off = self.c.reserve(sid, prompt, final)
            r = self.c.reservation(sid)
            assert r.offset == off and r.held >= r.size >= final
            self.expect[sid] = (np.zeros((0, HKV, D), np.float32),) * 2
        else:
            before = (self.c.usage(), self.c.allocator.free_blocks())
            with pytest.raises(OutOfMemoryError):
                self.c.reserve(sid, prompt, final)
            assert (self.c.usage(), self.c.allocator.free_blocks()) == before

    @precondition(lambda self: self.expect)
    @rule(i=st.integers(0, 10**6), frac=st.floats(0, 1))
    def write(self, i, frac):
        sid = sorted(self.expect)[i % len(self.expect)]
        r = self.c.reservation(sid)
        t = int(frac * (r.final_len - r.num_tokens))
        k, v = kv_data(self.rng, t)
        self.c.write(sid, k, v)
        ek, ev = self.expect[sid]
        self.expect[sid] = (np.concatenate([ek, k]), np.concatenate([ev, v]))

    @precondition(lambda self: self.expect)
    @rule(i=st.integers(0, 10**6))
    def release(self, i):
        sid = sorted(self.expect)[i % len(self.expect)]
        self.c.release(sid)
        del self.expect[sid]

    @invariant()
    def consistent(self):
        c = self.c
        check_invariants(c.allocator)
        regions = sorted((r.offset, r.held) for r in map(c.reservation, c.seq_ids))
        for (o1, h1), (o2, _) in zip(regions, regions[1:]):
            assert o1 + h1 <= o2, "two reservations overlap"
        assert c.num_free + sum(h for _, h in regions) == c.num_slots
        for need in {None, 1, self.msl, c.num_slots}:
            u = c.usage(need)
            assert u == usage_by_slot(c, need)
            assert sum(getattr(u, cat) for cat in CATEGORIES) == c.num_slots
        assert sum(c.breakdown().values()) == c.num_slots
        assert c.usage().token == sum(len(k) for k, _ in self.expect.values())
        for sid, (ek, ev) in self.expect.items():
            k, v = c.kv(sid)
            assert np.array_equal(k, ek) and np.array_equal(v, ev)

    def teardown(self):
        if hasattr(self, "c"):
            for sid in list(self.expect):
                self.c.release(sid)
            n = self.c.num_slots
            assert self.c.num_free == n and self.c.usage().free + \
                self.c.usage().external_fragmentation == n
            assert self.c.allocator.largest_free() == 1 << (n.bit_length() - 1)
            assert sum(s for _, s in self.c.allocator.free_blocks()) == n
            assert next_pow2(n) == n or len(self.c.allocator.free_blocks()) > 1


CacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30)
TestCacheMachine = CacheMachine.TestCase
