"""The ``cow-prefix`` scene tells the truth: every number in its captions and step logs, and its
"findable by hash" line, equal the live manager's state at that frame.

``cow_prefix_caption`` is also the scene's entry in tests/test_demo_consistency.py (which checks
the drawn pool of every scene against its manager); here, besides, every frame is rendered and
its text checked, and the scene must show what it is for: a shared partly filled block copied
on write, a copy hashed once full and then found by hash by another request, and every table
equal to a cold computation at every step.
"""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from minipaged.kit.viz.scenes.common import blocks_text
from minipaged.kit.viz.scenes.cow_prefix import BLOCK_SIZE, SAMPLES, CowPrefixScene


def _ints(pattern: str, text: str) -> list[int]:
    m = re.search(pattern, text)
    assert m, (pattern, text)
    return [int(g) for g in m.groups()]


def findable(m) -> list[int]:
    return sorted(m.allocator.cached_blocks().values())


def cow_prefix_caption(scene, frame, m) -> None:
    """Each caption's numbers against the manager ``m`` at this frame."""
    c, bs = frame.caption, m.block_size
    if c.startswith("Prefix caching is on."):
        n, full, fill, size = _ints(r"has (\d+) tokens: its (\d+) full blocks .* last block "
                                    r"\((\d+) of (\d+) slots\)", c)
        assert n == m.seq_len("A") and (full, fill) == divmod(n, bs) and size == bs
        table = m.block_table("A")
        assert [m.allocator.block_hash(b) is not None for b in table] == \
            [True] * full + [False] * (fill > 0)
    elif c.startswith("B and C fork A"):
        assert _ints(r"share all (\d+) blocks", c) == [len(m.block_table("A"))]
        for s in SAMPLES:
            assert m.block_table(s) == m.block_table("A")
        assert all(m.ref_count(b) == len(SAMPLES) for b in m.block_table("A"))
    elif c.startswith("Step"):
        copies = frame.views["pool"].copies
        if "copy-on-write copies" in c:
            assert _ints(r"(\d+) copy-on-write copies", c) == [len(copies)]
            assert len(copies) == sum(e.kind == "copy" for e in frame.events) > 0
        else:
            assert "No copies" in c and not copies
        if "filled a block" in c:
            names = re.search(r"\. ([A-C](?:, [A-C])*) filled a block", c).group(1).split(", ")
            assert names == [s for s in SAMPLES if m.seq_len(s) % bs == 0]
            assert _ints(r"\((\d+) blocks findable now\)", c) == [len(findable(m))]
            for s in names:  # the block it filled carries the hash of its own prefix
                assert m.allocator.block_hash(m.block_table(s)[-1]) is not None
        else:
            assert all(m.seq_len(s) % bs for s in SAMPLES)
    elif c.startswith("D arrives"):
        found, mine = _ints(r"(\d+) of its blocks are found by hash, (\d+) of them B's own", c)
        hits = m.block_table("D")[:found]
        assert m.token_ids("D")[:-1] == m.token_ids("B")
        assert found == (m.seq_len("D") - 1) // bs and hits == m.block_table("B")[:found]
        others = {b for s in ("A", "C") for b in m.block_table(s)}
        assert mine == sum(1 for b in hits if b not in others) >= 1
        assert m.ref_count(m.block_table("D")[-1]) == 1       # D's partly filled block
    elif c.startswith("All done."):
        assert _ints(r"(\d+) blocks stay findable", c) == [len(findable(m))]
        assert m.seq_ids == [] and m.num_free_blocks == m.num_blocks
    else:
        raise AssertionError(f"a caption no check knows: {c!r}")


def _frames(seed: int):
    scene = CowPrefixScene(seed=seed, width=100)
    for frame in scene.frames():
        console = Console(width=100, record=True, color_system=None, file=io.StringIO())
        console.print(frame.renderable())
        yield scene, frame, console.export_text()


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 7])
def test_every_frame_says_what_the_manager_holds(seed):
    saw_copy = saw_copy_hit = False
    for scene, frame, text in _frames(seed):
        m = scene.manager
        cow_prefix_caption(scene, frame, m)
        assert f"findable by hash: {blocks_text(findable(m))}" in text
        for e in frame.events:
            if e.kind == "check":
                assert e.text.endswith(": True"), e.text
                assert scene.kv.all_intact(m.seq_ids)
        saw_copy |= bool(frame.views["pool"].copies)
        saw_copy_hit |= frame.caption.startswith("D arrives")
        for s in m.seq_ids:  # a block with a hash is full wherever a table holds it
            table, n = m.block_table(s), m.seq_len(s)
            for i, b in enumerate(table):
                if m.allocator.block_hash(b) is not None:
                    assert n >= (i + 1) * BLOCK_SIZE, (s, b)
    assert saw_copy and saw_copy_hit


def test_copies_and_in_place_writes():
    """The first two writers into the shared block copy it; the last writes in place."""
    for scene, frame, _text in _frames(0):
        if frame.caption.startswith("Step 1:"):
            (src1, dst1), (src2, dst2) = frame.views["pool"].copies
            m = scene.manager
            assert src1 == src2 == m.block_table("C")[2]             # C kept the original
            assert [m.block_table(s)[2] for s in ("A", "B")] == [dst1, dst2]
            return
    raise AssertionError("no step 1")
