"""The pictures say what the state says: renderables of minipaged/viz parsed back to numbers.

Each test draws real manager state to plain text (no colour, as NO_COLOR would) and reads the
text back: memory-map cells must name each block's owner and reference count; a slot strip must
show as many slots of each category as the cache's own ``usage()`` counts; a waste bar must give
each category its share within one character. So nothing a picture says depends on colour.
"""

from __future__ import annotations

import re

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from rich.console import Console

from minipaged.contiguous.usage import CATEGORIES, KVUsage
from minipaged.kit.viz.arena import bar_segments, slot_strip, waste_bars
from minipaged.kit.viz.blocks import block_tables, fill_text, memory_map
from minipaged.kit.viz.scene import Event, step_log
from minipaged.kit.viz.state import count_categories, read_arena, read_pool
from minipaged.kit.viz.style import CATEGORY_GLYPH, EVENT_TAG, OKABE_ITO, Labels, seq_label


def text_of(renderable, width: int = 100) -> str:
    console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text()


def parse_map(text: str) -> dict[int, str]:
    """block id -> tag, from the first line of every memory-map cell (the grid sits between the
    heading line and the legend line)."""
    cells = {}
    for line in text.splitlines()[1:-1]:
        for m in re.finditer(r"(?:^| )\s*(\d+) (\S+)", line):
            cells[int(m.group(1))] = m.group(2)
    return cells


# ---- memory map ---------------------------------------------------------------------------------
ops = st.lists(st.tuples(st.sampled_from(["alloc", "append", "fork", "free"]),
                         st.integers(0, 5), st.integers(1, 9)), max_size=25)


@settings(max_examples=30)
@given(ops)
def test_memory_map_cells_name_owner_and_ref_count(ops):
    from minipaged.paged.block_allocator import OutOfBlocksError
    from minipaged.serving.swap import KVCacheManager

    m = KVCacheManager(16, 4)
    for op, s, n in ops:
        try:
            if op == "alloc" and s not in m.seq_ids:
                m.allocate(s, list(range(n)))
            elif op == "append" and s in m.seq_ids:
                m.append_slot(s, n)
            elif op == "fork" and s in m.seq_ids and s + 1 not in m.seq_ids:
                m.fork(s, s + 1)
            elif op == "free" and s in m.seq_ids:
                m.free(s)
        except OutOfBlocksError:
            pass
    copies = m.take_copies()
    labels = Labels()
    view = read_pool(m, copies=copies)
    cells = parse_map(text_of(memory_map(view, labels)))
    assert sorted(cells) == list(range(16))
    for b in range(16):
        owners = [s for s in m.seq_ids if b in m.block_table(s)]
        if not owners:
            assert m.ref_count(b) == 0
            assert cells[b] == "·", f"block {b} is free but drawn as {cells[b]!r}"
            continue
        want = labels(owners[0]) + (f"×{m.ref_count(b)}" if m.ref_count(b) > 1 else "")
        assert cells[b] == want, f"block {b}: owners {owners}, ref {m.ref_count(b)}"
    head = text_of(memory_map(view, labels)).splitlines()[0]
    assert f"{m.num_free_blocks} free" in head


def test_memory_map_shows_cached_blocks_of_the_prefix_cache():
    from minipaged.serving.swap import KVCacheManager

    m = KVCacheManager(8, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])
    table = m.block_table("a")
    m.free("a")
    view = read_pool(m)
    cells = parse_map(text_of(memory_map(view, Labels())))
    # the two full blocks keep their hash; the partial last block does not
    assert [cells[b] for b in table] == ["○", "○", "·"]
    assert "free but cached" in text_of(memory_map(view, Labels()))


def test_block_tables_show_physical_ids_and_fill():
    from minipaged.serving.swap import KVCacheManager

    m = KVCacheManager(8, 4)
    m.allocate(0, list(range(6)))
    m.allocate(1, [7])
    text = text_of(block_tables(read_pool(m), Labels()))
    a_row = next(line for line in text.splitlines() if line.strip().startswith("A len 6"))
    assert [int(x) for x in re.findall(r"#(\d+)", a_row)] == m.block_table(0)
    assert fill_text(4, 4) in text and fill_text(2, 4) in text and fill_text(1, 4) in text


# ---- contiguous arena strips -------------------------------------------------------------------
def strip_counts(text: str, labels_seen: set[str]) -> dict[str, int]:
    counts = dict.fromkeys(CATEGORIES, 0)
    glyph_to_cat = {CATEGORY_GLYPH[c]: c for c in CATEGORIES if c not in ("token", "reserved")}
    for line in text.splitlines():
        body = line[12:] if len(line) > 12 else ""
        if not line.strip() or line[12:13] == " ":
            continue
        for ch in body.rstrip():
            if ch in glyph_to_cat:
                counts[glyph_to_cat[ch]] += 1
            elif ch.upper() in labels_seen:
                counts["token" if ch.isupper() else "reserved"] += 1
    return counts


@settings(max_examples=30)
@given(st.sampled_from(["max", "pow2", "oracle"]),
       st.lists(st.tuples(st.integers(1, 8), st.integers(0, 20), st.integers(0, 20),
                          st.booleans()), max_size=10))
def test_slot_strip_counts_equal_the_caches_usage(policy, reqs):
    from minipaged.contiguous.cache import ContiguousKVCache

    cache = ContiguousKVCache(128, 1, 2, policy=policy, max_seq_len=32, store_kv=False)
    for i, (prompt, out, written, release) in enumerate(reqs):
        final = min(32, prompt + out)
        if cache.can_reserve(prompt, final):
            cache.reserve(i, prompt, final)
            cache.advance(i, min(written, final - prompt))
            if release:
                cache.release(i)
    labels = Labels()
    for s in cache.seq_ids:
        labels(s)
    for need in (None, 1, 9, 32):
        view = read_arena(cache, need)
        slots = view.slot_categories()
        usage = cache.usage(need).as_dict()
        assert count_categories(slots) == {c: usage[c] for c in CATEGORIES}
        drawn = strip_counts(text_of(slot_strip(policy, slots, labels)),
                             {labels(s) for s in cache.seq_ids})
        assert drawn == {c: usage[c] for c in CATEGORIES}


# ---- waste bars --------------------------------------------------------------------------------
usages = st.lists(st.integers(0, 500), min_size=5, max_size=5).map(
    lambda c: KVUsage(sum(c), *c))


@given(usages, st.integers(1, 60))
def test_bar_segments_add_up_and_stay_within_one_character(usage, length):
    segs = dict(bar_segments(usage, length))
    assert sum(segs.values()) == length
    if usage.total:
        for c in CATEGORIES:
            exact = getattr(usage, c) * length / usage.total
            assert abs(segs[c] - exact) < 1, (c, segs[c], exact)


@given(usages)
def test_waste_bar_prints_each_share_in_percent(usage):
    text = text_of(waste_bars([("x", usage)]))
    row = next(line for line in text.splitlines() if line.strip().startswith("x "))
    pcts = [int(p) for p in re.findall(r"(\d+)%", row)]
    fr = usage.fractions()
    assert pcts == [int(f"{100 * fr[c]:.0f}") for c in CATEGORIES]


def test_bar_segments_rejects_bad_length():
    with pytest.raises(ValueError, match="length=0"):
        bar_segments(KVUsage(1, 1, 0, 0, 0, 0), 0)


# ---- readable without colour ------------------------------------------------------------------
def test_every_colour_has_a_distinct_glyph_or_tag():
    glyphs = [CATEGORY_GLYPH[c] for c in CATEGORIES]
    assert len(set(glyphs)) == len(glyphs)
    tags = [t for t, _ in EVENT_TAG.values()]
    assert len(set(tags)) == len(tags)
    assert len({seq_label(i) for i in range(200)}) == 200
    assert len(set(OKABE_ITO)) == len(OKABE_ITO)


def test_step_log_lists_events_and_counts_the_rest():
    text = text_of(step_log([Event("admit", f"e{i}") for i in range(10)], limit=3))
    assert "e0" in text and "e2" in text and "e3" not in text and "7 more" in text
    with pytest.raises(ValueError, match="kind='bogus'"):
        Event("bogus", "x")


def test_labels_are_stable_and_validated():
    labels = Labels()
    assert [labels(s) for s in ("x", "y", "x")] == ["A", "B", "A"]
    labels.name("z", "B2")
    assert labels("z") == "B2" and labels.letter("z") == "B"
    with pytest.raises(ValueError, match="name=''"):
        labels.name("w", "")
    with pytest.raises(ValueError, match="index=-1"):
        seq_label(-1)
