"""The demo never lies: at every frame of every scene, what is drawn equals the managers' state.

Each scene is paused at every frame (its generator is stepped one frame at a time), and every
view the frame drew is compared with an independent re-reading of the live managers:

* a paged pool: each physical block's owners are exactly the sequences whose block table holds
  it, its reference count is the manager's, free blocks are the manager's free count, and the
  slots drawn per category add up to the manager's own ``usage()``;
* a contiguous arena: the slots drawn per category equal ``usage(need)``, and each drawn
  reservation is the cache's own;
* every number a caption or a step-log line states is the live managers'.
Seeds vary so that more than one layout is checked. The model scene's own promises (the real
engine's tokens, sharing and copies) are tested in tests/test_demo_model_scene.py.
"""

from __future__ import annotations

import ast
import re

import pytest
from test_demo_cow_prefix import cow_prefix_caption

from minipaged.contiguous.buddy import next_pow2
from minipaged.contiguous.usage import CATEGORIES
from minipaged.kit.viz.scenes import SCENES
from minipaged.kit.viz.state import ArenaView, PoolView, count_categories

READY = [cls for cls in SCENES if cls.missing() is None]


def check_pool(view: PoolView, m, final_lens) -> None:
    swapped = set(getattr(m, "swapped_seq_ids", ()))
    live = [s for s in m.seq_ids if s not in swapped]
    assert [t.seq_id for t in view.tables] == live
    assert view.num_free == m.num_free_blocks
    for t in view.tables:
        assert list(t.blocks) == m.block_table(t.seq_id)
        assert t.seq_len == m.seq_len(t.seq_id)
    for b in view.blocks:
        owners = [s for s in live if b.block in m.block_table(s)]
        assert list(b.owners) == owners, f"block {b.block}"
        assert b.ref_count == m.ref_count(b.block), f"block {b.block}"
        if b.state in ("free", "cached"):
            assert m.ref_count(b.block) == 0
    n_free = sum(1 for b in view.blocks if b.state in ("free", "cached"))
    assert n_free == m.num_free_blocks
    cached = getattr(m.allocator, "cached_blocks", dict)()   # prefix caching only
    assert view.hashed == set(cached.values())
    assert {b.block for b in view.blocks if b.state == "cached"} <= view.hashed
    if not any(b.state == "held" for b in view.blocks):
        usage = m.usage(final_lens).as_dict()
        assert count_categories(view.slot_categories(final_lens)) == {
            c: usage[c] for c in CATEGORIES}
    for t in view.swapped:
        assert list(t.blocks) == m.cpu_block_table(t.seq_id)


def check_arena(view: ArenaView, cache) -> None:
    usage = cache.usage(view.need)
    assert view.usage == usage
    assert count_categories(view.slot_categories()) == {c: getattr(usage, c) for c in CATEGORIES}
    assert [r.seq_id for r in view.reservations] == cache.seq_ids
    for r in view.reservations:
        mine = cache.reservation(r.seq_id)
        assert (r.offset, r.held, r.num_tokens, r.final_len) == (
            mine.offset, mine.held, mine.num_tokens, mine.final_len)


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("cls", READY, ids=[c.name for c in READY])
def test_every_frame_shows_the_managers_state(cls, seed):
    scene = cls(seed=seed, width=100)
    n = 0
    for frame in scene.frames():
        managers = scene.managers()
        final = frame.views.get("final_lens", {})
        checked = 0
        for name, view in frame.views.items():
            if isinstance(view, PoolView):
                check_pool(view, managers[name], final.get(name))
                checked += 1
            elif isinstance(view, ArenaView):
                check_arena(view, managers[name])
                checked += 1
        assert checked, f"frame {n} of {cls.name} carries no view to check"
        n += 1
    assert n >= 3


# ---- every number a caption or a step-log line states, against the live managers -------------

def _seq(scene, label, candidates):
    """The seq_id a picture calls ``label``."""
    return next(s for s in candidates if scene.labels(s) == label)


def _ints(pattern, text):
    m = re.search(pattern, text)
    assert m, (pattern, text)
    return [int(g) if g.lstrip("-").isdigit() else g for g in m.groups()]


def _paging(scene, frame, m):
    if frame.caption.startswith("An empty pool"):
        assert _ints(r"(\d+) physical blocks of (\d+) slots", frame.caption) == [
            m.num_blocks, m.block_size]
    elif "arrives" in frame.caption:
        label, n, k = _ints(r"^(\w) arrives with a prompt of (\d+) tokens: it gets (\d+) block",
                            frame.caption)
        s = _seq(scene, label, m.seq_ids)
        assert (n, k) == (m.seq_len(s), len(m.block_table(s)))
        room = -m.seq_len(s) % m.block_size
        if room:
            assert _ints(r"its last block has (\d+) free slot", frame.caption) == [room]
        else:
            assert "all are full, so its next token will take a new block" in frame.caption
    elif "finished" in frame.caption:
        label = frame.caption.split()[0]
        assert label not in [scene.labels(s) for s in m.seq_ids]


def _fragmentation(scene, frame, managers):
    systems = {s.kind: s for s in scene.systems}
    if frame.caption.startswith("After step"):
        step = _ints(r"After step (\d+)\.", frame.caption)[0]
        if " holds " in frame.caption:
            label, kind, since, p, d, n = _ints(
                r"(\w) in (\w+), admitted at step (\d+) with (\d+) prompt tokens, holds "
                r"\d+ \+ (\d+) = (\d+) tokens", frame.caption)
            cache = managers[kind]
            s = _seq(scene, label, cache.seq_ids)
            assert p == cache.reservation(s).prompt_len and n == cache.seq_len(s)
            assert p + d == n and d == step - since
    for e in frame.events:
        kind = e.text.split(":")[0]
        if kind not in systems:
            continue
        system, cache = systems[kind], managers[kind]
        waits = re.search(r"(\w) waits \(needs (\d+) (contiguous slots|blocks)", e.text)
        assert (waits is not None) == bool(system.waiting), e.text
        if waits is None:
            continue
        label, need = waits.group(1), int(waits.group(2))
        head = system.waiting[0]
        assert scene.labels(head) == label
        if kind == "paged":
            assert need == -(-len(system.tokens[head]) // cache.block_size)
            assert _ints(r"blocks, (\d+) free\)", e.text) == [cache.num_free_blocks]
            continue
        r = system.requests[head]
        assert need == cache.reservation_size(len(r.prompt), r.final_len)
        pieces = sorted((n for _, n in cache.allocator.free_blocks()), reverse=True)
        if cache.num_free < need:
            assert _ints(r"contiguous slots, (\d+) free\)", e.text) == [cache.num_free]
        else:  # enough free slots, none in one buddy block large enough: say why
            block, free, shown = _ints(r"buddy block of (\d+); the (\d+) free slots are buddy "
                                       r"blocks of ([\d+]+)\)", e.text)
            assert block == next_pow2(need) > max(pieces) and free == cache.num_free
            assert [int(x) for x in str(shown).split("+")] == pieces
    for name, cache in managers.items():
        running = len(cache.seq_ids)
        assert len(systems[name].running) == running


def _fork(scene, frame, m):
    view = frame.views["pool"]
    if frame.caption.startswith("A prompt of"):
        assert _ints(r"A prompt of (\d+) tokens", frame.caption) == [m.seq_len(0)]
    if "copy-on-write copies" in frame.caption:
        n = _ints(r"(\d+) copy-on-write copies", frame.caption)[0]
        assert n == len(view.copies) == sum(e.kind == "copy" for e in frame.events) > 0
    elif "no copies" in frame.caption:
        assert not view.copies


def _beam(scene, frame, m):
    if frame.caption.startswith("Step"):
        c, b, f, d = _ints(r"(\d+) candidates, the (\d+) best survive \((\d+) forked, (\d+) "
                           r"dropped\)", frame.caption)
        beams = len(frame.views["pool"].tables)
        assert b == beams == len(m.seq_ids)
        assert f == sum(e.kind == "fork" for e in frame.events)
        assert d == sum(e.kind == "free" for e in frame.events)
        assert c == 3 * (beams - f + d)  # three candidates from every beam of the step before


def _prefix(scene, frame, m):
    cached_free = sum(1 for b in m.allocator.cached_blocks().values() if m.ref_count(b) == 0)
    if "arrives" in frame.caption:
        rid = frame.caption.split()[0]
        if "prefix-cache hits" in frame.caption:
            hits, n = _ints(r"(\d+) of (\d+) prompt tokens are prefix-cache hits", frame.caption)
            assert n == m.seq_len(rid) and hits % m.block_size == 0
            for b in m.block_table(rid)[:hits // m.block_size]:
                assert m.allocator.block_hash(b) is not None
        if "evicted" in frame.caption:
            n = _ints(r"(\d+) cached blocks were evicted", frame.caption)[0]
            evict = next(e.text for e in frame.events if e.kind == "evict")
            assert n == evict.count("#")
    if "free but cached" in frame.caption:
        assert _ints(r"free but cached \((\d+) now\)", frame.caption) == [cached_free]


def _preempt(scene, frame, m):
    if frame.caption.startswith("Four requests"):
        nb, need = _ints(r"pool of (\d+) blocks; .* need (\d+) blocks", frame.caption)
        assert nb == m.num_blocks
        assert need == sum(-(-f // m.block_size) for f in scene.final.values())
        return
    mixed, running, waiting = re.match(r"Decode step \d+( \(a prefill and the decodes in one "
                                       r"step\))?: running (.*); waiting (.*)\.$",
                                       frame.caption).groups()
    assert bool(mixed) == any("re-admitted" in e.text for e in frame.events)
    live = [s for s in m.seq_ids if not m.is_swapped(s)]
    assert running == (", ".join(live) or "nobody")
    swapped = re.findall(r"(\w) \(swapped\)", waiting)
    assert swapped == list(m.swapped_seq_ids)
    for s in re.findall(r"(\w) \(to recompute\)", waiting):
        assert s not in m.seq_ids  # a request waiting to be recomputed holds no blocks


def _attention(scene, frame, m):
    if frame.caption.startswith("Sequence A has"):
        n, table = re.search(r"has (\d+) tokens in blocks (\[[\d, ]+\])", frame.caption).groups()
        assert int(n) == m.seq_len("A") and ast.literal_eval(table) == m.block_table("A")
    elif frame.caption.startswith("Logical block"):
        i, b, filled = _ints(r"Logical block (\d+) of A lives in physical block #(\d+): the "
                             r"query reads its (\d+) keys", frame.caption)
        assert m.block_table("A")[i] == b
        assert filled == min(m.block_size, m.seq_len("A") - i * m.block_size)


def _model(scene, frame, m):
    for free, total in re.findall(r"(\d+) of (\d+) (?:now free|blocks free)", frame.caption):
        assert (int(free), int(total)) == (m.num_free_blocks, m.num_blocks)
    if "reference count 2" in frame.caption:
        assert any(b.ref_count == 2 for b in frame.views["pool"].blocks)
    if "every block is back on the free list" in frame.caption:
        assert m.num_free_blocks == m.num_blocks


CAPTION_CHECKS = {"paging": _paging, "fragmentation": _fragmentation, "fork": _fork,
                  "beam": _beam, "prefix": _prefix, "preempt": _preempt,
                  "attention": _attention, "model": _model, "cow-prefix": cow_prefix_caption}


@pytest.mark.parametrize("seed", [0, 3, 7])
@pytest.mark.parametrize("cls", READY, ids=[c.name for c in READY])
def test_every_number_in_a_caption_is_the_managers(cls, seed):
    scene = cls(seed=seed, width=100)
    check = CAPTION_CHECKS[cls.name]
    for frame in scene.frames():
        managers = scene.managers()
        check(scene, frame, managers if cls.name == "fragmentation" else managers["pool"])
