"""KVCacheManager basics: block tables grow on demand, slot mapping, usage accounting, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from invariants import check_invariants
from test_kv_cache_stateful import snapshot

from minipaged.paged.block_allocator import OutOfBlocksError
from minipaged.paged.block_manager import pad_tables
from minipaged.serving.swap import KVCacheManager


def test_tables_grow_one_block_at_a_time():
    m = KVCacheManager(num_blocks=8, block_size=4)
    assert m.allocate("a", [1, 2, 3]) == 0
    assert m.block_table("a") == [0]
    slots = [m.append_slot("a", 9)]  # position 3 still fits in block 0
    assert m.block_table("a") == [0]
    slots.append(m.append_slot("a", 9))  # position 4: block 0 is full, a new block
    assert m.block_table("a") == [0, 1]
    assert slots == [3, 4]
    assert m.seq_len("a") == 5 and m.token_ids("a") == [1, 2, 3, 9, 9]


@given(bs=st.integers(1, 16), n=st.integers(1, 100), extra=st.integers(0, 40))
def test_slot_mapping_formula(bs, n, extra):
    m = KVCacheManager(num_blocks=2 * 140, block_size=bs)
    m.allocate(0, range(n))
    m.allocate(1, range(n))  # interleave two sequences so physical blocks are scattered
    for _ in range(extra):
        m.append_slot(1, 0)
        m.append_slot(0, 0)
    table = m.block_table(0)
    slots = m.slot_mapping(0, 0, n + extra)
    assert slots.dtype == np.int64
    assert slots.tolist() == [table[p // bs] * bs + p % bs for p in range(n + extra)]
    assert len(table) == -(-(n + extra) // bs)


def test_block_tables_padded_int32():
    m = KVCacheManager(num_blocks=8, block_size=2)
    m.allocate("a", range(5))
    m.allocate("b", range(1))
    t = m.block_tables(["a", "b"])
    assert t.dtype == np.int32 and t.tolist() == [[0, 1, 2], [3, -1, -1]]
    assert m.block_tables(["b"], pad=0).tolist() == [[3]]
    # the one padding rule, which the model's runner uses for its lists of blocks too
    assert pad_tables([[5], [6, 7]]).tolist() == [[5, -1], [6, 7]]
    assert pad_tables([]).shape == (0, 0)


def test_out_of_blocks_says_needed_and_free_and_changes_nothing():
    m = KVCacheManager(num_blocks=3, block_size=4)
    m.allocate("a", range(8))
    with pytest.raises(OutOfBlocksError) as e:
        m.allocate("b", range(9))
    assert (e.value.needed, e.value.free) == (3, 1)
    assert "needed 3" in str(e.value) and "1 free" in str(e.value)
    assert m.seq_ids == ["a"] and m.num_free_blocks == 1
    assert not m.can_allocate(9) and m.can_allocate(4)
    m.allocate("c", range(4))
    with pytest.raises(OutOfBlocksError):
        m.append_slot("a", 1)  # "a" ends exactly at a block boundary: needs a new block
    assert m.seq_len("a") == 8 and m.block_table("a") == [0, 1]


def test_usage_categories_paged():
    m = KVCacheManager(num_blocks=10, block_size=4)
    m.allocate("a", range(5))  # 2 blocks, 5 tokens, 3 unfilled slots
    m.allocate("b", range(4))  # 1 full block
    u = m.usage()
    assert (u.total, u.token, u.reserved, u.internal_fragmentation, u.free) == (40, 9, 0, 3, 28)
    u = m.usage({"a": 7, "b": 4})  # "a" will grow to 7: 2 of its 3 unfilled slots are reserved
    assert (u.token, u.reserved, u.internal_fragmentation) == (9, 2, 1)
    assert u.external_fragmentation == 0  # any free block serves any sequence


def test_freeing_everything_refills_the_pool():
    m = KVCacheManager(num_blocks=6, block_size=3)
    for s in range(3):
        m.allocate(s, range(5))
    for s in range(3):
        m.free(s)
    assert m.num_free_blocks == 6 and m.seq_ids == []
    check_invariants(m)


def test_bad_inputs():
    m = KVCacheManager(num_blocks=4, block_size=2)
    m.allocate("a", [1, 2, 3])
    with pytest.raises(ValueError, match="block_size=0"):
        KVCacheManager(4, 0)
    with pytest.raises(ValueError, match="num_blocks=0"):
        KVCacheManager(0, 16)
    with pytest.raises(ValueError, match="seq_id='a' is already allocated"):
        m.allocate("a", [1])
    with pytest.raises(ValueError, match="token_ids is empty"):
        m.allocate("b", [])
    with pytest.raises(TypeError, match=r"token_ids\[0\]=1.5 must be an integer"):
        m.allocate("b", [1.5, 2.0])
    with pytest.raises(TypeError, match="token_id=1.5"):
        m.append_slot("a", 1.5)
    with pytest.raises(KeyError, match="seq_id='zz' is not allocated"):
        m.append_slot("zz", 1)
    with pytest.raises(KeyError, match="seq_id='zz'"):
        m.free("zz")
    with pytest.raises(ValueError, match=r"end=5 is out of range: expected in \[0, 4\)"):
        m.slot_mapping("a", 0, 5)
    with pytest.raises(ValueError, match=r"end=1 is out of range: expected in \[2, 4\)"):
        m.slot_mapping("a", 2, 1)
    with pytest.raises(ValueError, match="num_tokens=0"):
        m.can_allocate(0)
    m.free("a")
    with pytest.raises(KeyError):
        m.free("a")  # double free of a sequence


@pytest.mark.parametrize("prefix", [False, True])
def test_fast_usage_equals_the_block_by_block_oracle(prefix):
    """``usage`` (O(#sequences)) against ``usage_slow`` (every table entry) after every step
    of a seeded random mix of allocate / append / fork / free / swap, with shared prompts,
    pending copy-on-write copies (and their sources held for them) and planned final lengths.
    The only error expected is a full pool (OutOfBlocksError, which changes nothing:
    test_kv_cache_stateful.py checks that), and swap_out of a sequence whose copy-on-write copy
    is still pending, asserted where it happens."""
    rng = np.random.default_rng(7)
    m = KVCacheManager(24, 4, enable_prefix_caching=prefix, num_cpu_blocks=24)
    live: list[int] = []
    for step in range(600):
        op = rng.integers(0, 6)
        on_gpu = [s for s in live if not m.is_swapped(s)]
        pick = live[int(rng.integers(len(live)))] if live else None
        try:
            if op == 0 or len(live) < 2:
                m.allocate(step, [1, 2, 3, 4, 5][:1 + step % 5] + [step] * int(rng.integers(6)))
                live.append(step)
            elif op in (1, 2) and on_gpu:
                m.append_slot(on_gpu[int(rng.integers(len(on_gpu)))], int(rng.integers(9)))
            elif op == 3 and on_gpu:
                m.fork(on_gpu[int(rng.integers(len(on_gpu)))], 10_000 + step)
                live.append(10_000 + step)
            elif op == 4:
                m.free(pick)
                live.remove(pick)
            elif m.is_swapped(pick):
                m.swap_in([pick])
            else:
                if rng.random() < 0.3:  # else copies stay pending: swap_out may refuse
                    m.take_copies()
                if set(m.block_table(pick)) & {dst for _, dst in m.pending_copies}:
                    with pytest.raises(ValueError, match="take_copies"):
                        m.swap_out([pick])
                else:
                    m.swap_out([pick])
        except OutOfBlocksError:
            pass  # a full GPU or CPU pool
        on_gpu = [s for s in live if not m.is_swapped(s)]
        finals = {s: m.seq_len(s) + (s * 5) % 11 for s in on_gpu}
        assert m.usage() == m.usage_slow() and m.usage(finals) == m.usage_slow(finals)
    check_invariants(m)


def test_numpy_integers_are_accepted_and_bools_refused():
    m = KVCacheManager(np.int64(8), np.int32(2), num_cpu_blocks=np.int16(2))
    m.allocate("a", np.array([1, 2, 3]))
    assert m.append_slot("a", np.int16(4)) == 3
    assert m.slot_mapping("a", np.int64(1), np.uint8(4)).tolist() == [1, 2, 3]
    assert m.block_tables(["a"], pad=np.int8(-7)).tolist() == [[0, 1]]
    assert m.can_allocate(np.int64(12)) and m.token_ids("a") == [1, 2, 3, 4]
    before = snapshot(m)
    bad_calls = [lambda: m.append_slot("a", True), lambda: m.allocate("b", [1, False]),
                 lambda: m.slot_mapping("a", 0, np.bool_(True)), lambda: m.can_allocate(True),
                 lambda: KVCacheManager(True, 2), lambda: KVCacheManager(4, 2, num_cpu_blocks=True)]
    for call in bad_calls:
        with pytest.raises(TypeError, match="bool"):
            call()
    assert snapshot(m) == before


def test_unhashable_seq_ids_are_refused_by_name():
    m = KVCacheManager(8, 2, enable_prefix_caching=True, num_cpu_blocks=4)
    m.allocate("a", [1, 2, 3])
    before = snapshot(m)
    for call in (lambda: m.allocate(["b"], [1]), lambda: m.append_slot(["b"], 1),
                 lambda: m.free(["b"]), lambda: m.block_table(["b"]), lambda: m.fork("a", ["b"]),
                 lambda: m.swap_out([["b"]]), lambda: m.is_swapped(["b"])):
        with pytest.raises(TypeError, match=r"seq_ids?(\[0\])?=\['b'\] must be hashable"):
            call()
    assert snapshot(m) == before


@pytest.mark.parametrize("prefix", [False, True])
def test_a_new_seq_id_must_be_findable_again(prefix):
    """A NaN id could be allocated but never freed (it equals nothing), and True would alias
    sequence 1: both are refused when the sequence is created, and nothing changes."""
    m = KVCacheManager(4, 4, enable_prefix_caching=prefix)
    m.allocate(1, [1, 2])
    for bad, err in ((float("nan"), ValueError), (True, TypeError)):
        with pytest.raises(err, match="seq_id="):
            m.allocate(bad, [1])
        with pytest.raises(err, match="child_seq_id="):
            m.fork(1, bad)
    assert m.num_free_blocks == 3 and m.block_table(1) == [0]


def test_usage_checks_final_lens_before_counting():
    """``final_lens`` maps live seq ids to ints >= their length now: a float was truncated (7.5
    counted as 7), a shorter length, an unknown id or a list went through or broke elsewhere."""
    m = KVCacheManager(10, 4, num_cpu_blocks=4)
    m.allocate("a", [1, 2, 3])
    m.allocate("s", [1])
    m.swap_out(["s"])
    before = snapshot(m)
    for bad, err, match in (
            ({"a": 7.5}, TypeError, r"final_lens\['a'\]=7.5 must be an integer"),
            ({"a": None}, TypeError, r"final_lens\['a'\]=None must be an integer"),
            ({"a": True}, TypeError, r"final_lens\['a'\]=True must be an integer, not a bool"),
            ({"a": 2}, ValueError, r"final_lens\['a'\]=2 is out of range: expected >= 3"),
            ({"a": -1}, ValueError, r"final_lens\['a'\]=-1 is out of range"),
            ({"zz": 5}, KeyError, "final_lens names seq_id='zz', which is not allocated"),
            ([1, 2], TypeError, "final_lens must be a mapping of seq ids to final lengths")):
        for usage in (m.usage, m.usage_slow):
            with pytest.raises(err, match=match):
                usage(bad)
    assert snapshot(m) == before
    u = m.usage({"a": np.int64(7), "s": 1})  # a swapped sequence is live too
    assert u == m.usage_slow({"a": 7}) and (u.token, u.reserved) == (3, 1)


def test_flags_are_bools_not_truthy_values():
    """'yes' turned prefix caching on and None turned it off; cache=None skipped caching."""
    for bad in ("yes", None, 1):
        with pytest.raises(TypeError, match=f"enable_prefix_caching={bad!r} must be a bool"):
            KVCacheManager(10, 16, enable_prefix_caching=bad)
    assert KVCacheManager(10, 16, enable_prefix_caching=np.True_).enable_prefix_caching is True
    for prefix in (False, True):
        m = KVCacheManager(10, 4, enable_prefix_caching=prefix)
        m.allocate("a", [1, 2, 3, 4, 5])
        before = snapshot(m)
        for bad in (None, "no", 0):
            with pytest.raises(TypeError, match=f"cache={bad!r} must be a bool"):
                m.allocate("c", [1, 2, 3, 4, 5], cache=bad)
        assert snapshot(m) == before
        assert m.allocate("c", [1, 2, 3, 4, 5], cache=np.False_) == 4 * prefix


@pytest.mark.parametrize("name", ["num_blocks", "num_cpu_blocks", "block_size"])
@pytest.mark.parametrize("n", [2**31, 10**30])
def test_sizes_are_below_2_31_like_int32_block_ids(name, n):
    """10**30 blocks raised a bare OverflowError that named nothing (a block_size of 2**62
    overflowed int64 slot numbers unseen)."""
    with pytest.raises(ValueError, match=rf"{name}={n} is out of range: expected in "
                                         r"\[[01], 2147483648\)"):
        KVCacheManager(**(dict(num_blocks=4, block_size=16) | {name: n}))


def test_token_ids_must_have_an_order():
    """A dict was read as its keys and a set in its own order: neither is a sequence."""
    m = KVCacheManager(4, 2)
    m.allocate("a", [1, 2, 3])
    before = snapshot(m)
    for bad, kind in (({1: 2}, "dict"), ({3, 1, 2}, "set"), (frozenset({1}), "frozenset")):
        with pytest.raises(TypeError, match=f"token_ids=.* must be a sequence of integer token "
                                            f"ids, not a {kind}$"):
            m.allocate("c", bad)
        with pytest.raises(TypeError, match=f"not a {kind}$"):
            m.blocks_to_allocate(bad)
    assert snapshot(m) == before


def test_block_table_padding_must_fit_int32():
    """pad=2**40 was NumPy's OverflowError, which names no argument."""
    m = KVCacheManager(4, 2)
    m.allocate("a", [1, 2, 3])
    with pytest.raises(ValueError, match=r"pad=1099511627776 is out of range"):
        m.block_tables(["a"], pad=2**40)
    assert m.block_tables(["a"], pad=-2**31).tolist() == [[0, 1]]
