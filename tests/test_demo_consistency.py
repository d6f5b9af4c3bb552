"""The demo never lies: at every frame of every scene, what is drawn equals the managers' state.

Each scene is paused at every frame (its generator is stepped one frame at a time), and every
view the frame drew is compared with an independent re-reading of the live managers:

* a paged pool: each physical block's owners are exactly the sequences whose block table holds
  it, its reference count is the manager's, free blocks are the manager's free count, and the
  slots drawn per category add up to the manager's own ``usage()``;
* a contiguous arena: the slots drawn per category equal ``usage(need)`` and its slow oracle
  ``usage_slow(need)``, and each drawn reservation is the cache's own.
Seeds vary so that more than one layout is checked.
"""

from __future__ import annotations

import pytest

from minipaged.usage import CATEGORIES
from minipaged.viz.scenes import SCENES
from minipaged.viz.state import ArenaView, PoolView, count_categories

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
    if not any(b.state == "held" for b in view.blocks):
        usage = m.usage(final_lens).as_dict()
        assert count_categories(view.slot_categories(final_lens)) == {
            c: usage[c] for c in CATEGORIES}
    for t in view.swapped:
        assert list(t.blocks) == m.cpu_block_table(t.seq_id)


def check_arena(view: ArenaView, cache) -> None:
    usage = cache.usage(view.need)
    assert view.usage == usage == cache.usage_slow(view.need)
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
