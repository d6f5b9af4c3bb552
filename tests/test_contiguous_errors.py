"""The contiguous KV cache under bad input: every bad argument to the constructor, reserve,
write, advance, release and usage gets an error that names it, and a refused call changes
nothing (running out of memory included)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from contiguous_helpers import HKV, D, kv_data

from minipaged import ContiguousKVCache
from minipaged.contiguous.cache import OutOfMemoryError
from minipaged.paged.block_allocator import OutOfBlocksError


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


def test_numpy_lengths_are_stored_as_ints():
    """They were stored as given, so breakdown() held NumPy ints that JSON cannot write."""
    c = ContiguousKVCache(256, HKV, D, policy="pow2", max_seq_len=64)
    c.reserve("a", np.int64(4), np.int32(10))
    r = c.reservation("a")
    assert type(r.prompt_len) is int and type(r.final_len) is int
    assert json.loads(json.dumps(c.breakdown()))["reserved"] == 10
