"""The block-table diagram of the slides: each sequence's block table above the physical pool.

What it teaches: nothing new; it draws a ``KVCacheManager``'s state for ``figures.py``, read
the way the demo reads it (``viz/state.read_pool``, public methods only), so the picture cannot
show anything the manager does not hold. Top: one row per sequence, its logical blocks left to
right, each naming the physical block it maps to. Bottom: the pool, one box per physical block
with its slots (filled in the colour of the sequence that wrote them, dark when several
sequences share the block), its reference count (``×n`` when above 1), a dot when the prefix
cache holds its hash, and a dashed outline when it is this step's copy-on-write copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minipaged.kit.diagrams import (
    COPY_MARK,
    HASH_MARK,
    INK,
    KEPT,
    LINE,
    MUTED,
    PAPER,
    SHARED,
    TEXT_ON,
    Canvas,
    Drawing,
    caption,
    legend,
    text_width,
    twin,
)
from minipaged.kit.viz.state import PoolView, read_pool


@dataclass
class PoolState:
    """What ``draw`` shows: the demo's ``PoolView`` of the manager (``viz/state.py``, with the
    blocks that carry a prefix hash, in a table or not) and the sequences preempted by
    recomputation, which the manager no longer holds (their tokens kept, by the caller)."""

    view: PoolView
    waiting: dict[str, int] = field(default_factory=dict)       # recompute: tokens kept
    cpu_note: str = ""

    @property
    def tables(self) -> dict[str, list[int]]:
        """seq -> its block table, for the sequences on the GPU, in the manager's order."""
        return {t.seq_id: list(t.blocks) for t in self.view.tables}

    @property
    def ref(self) -> list[int]:
        return [b.ref_count for b in self.view.blocks]


def read_state(manager, waiting: dict | None = None) -> PoolState:
    """The state ``draw`` needs, from a KVCacheManager's public methods. ``waiting``: sequences
    preempted by recomputation (the manager forgot them; the caller keeps their tokens)."""
    return PoolState(read_pool(manager), {s: len(t) for s, t in (waiting or {}).items()})


@dataclass
class Marks:
    """What happened in the step the picture follows."""

    copies: dict[int, int] = field(default_factory=dict)   # copy-on-write: dst -> src
    written: set[int] = field(default_factory=set)         # slots written this step


def draw(state: PoolState, colors: dict[str, str], notes: list[str], title: str,
         marks: Marks | None = None) -> Drawing:
    marks = marks or Marks()
    c, text = Canvas(), []
    y = _tables(c, state, colors, text)
    y = _pool(c, state, colors, marks, y + 18, text)
    if state.cpu_note:
        c.text(4, y + 26, state.cpu_note, 22)
        text.append(state.cpu_note)
        y += 36
    y = legend(c, y + 4, _legend_items(state, marks))
    caption(c, y, notes, 22)
    return Drawing(c.svg(title), twin(text + [""] + notes))


CHIP_W, ROW_H = 250, 46


def _tables(c: Canvas, st: PoolState, colors: dict[str, str], text: list[str]) -> float:
    v = st.view
    c.text(4, 26, "block tables (logical block → physical block)", 24, bold=True)
    text.append("block tables (logical block -> physical block)")
    most = max([len(t.blocks) for t in (*v.tables, *v.swapped)] + [1])
    x0 = CHIP_W + 16
    cell_w = min(96.0, (c.width - x0) / most - 8)
    c.text(4, 56, "logical block", 20, fill=MUTED)
    for i in range(most):
        c.text(x0 + i * (cell_w + 8) + cell_w / 2, 56, str(i), 20, anchor="middle", fill=MUTED)

    def cells(y: float, labels: list[str], size: int, bold: bool, **box) -> None:
        for i, label in enumerate(labels):
            cx = x0 + i * (cell_w + 8)
            c.rect(cx, y, cell_w, ROW_H, **box)
            c.text(cx + cell_w / 2, y + 32, label, size, anchor="middle", bold=bold)

    y = 66
    for t in v.tables:                          # on the GPU: a filled chip, solid cells
        s, color, ids = t.seq_id, colors[t.seq_id], [f"#{b}" for b in t.blocks]
        c.rect(4, y, CHIP_W, ROW_H, fill=color, stroke=INK, width=1.5)
        c.text(16, y + 31, f"{s} · {t.seq_len} tokens", 22, bold=True, fill=TEXT_ON[color])
        cells(y, ids, 24, True, stroke=color, width=5)
        text.append(f"  {s:<3} {t.seq_len:>3} tokens   " + " ".join(ids))
        y += ROW_H + 8
    for t in v.swapped:                         # in the CPU pool: dashed
        ids = [f"cpu {b}" for b in t.blocks]
        c.rect(4, y, CHIP_W, ROW_H, stroke=colors[t.seq_id], width=5, dash=True)
        c.text(16, y + 31, f"{t.seq_id} · swapped out", 22, bold=True)
        cells(y, ids, 22, False, stroke=LINE, width=3, dash=True)
        text.append(f"  {t.seq_id:<3} swapped out: CPU blocks " + " ".join(ids))
        y += ROW_H + 8
    for s, n in st.waiting.items():             # preempted by recomputation: no blocks at all
        c.rect(4, y, CHIP_W, ROW_H, stroke=colors[s], width=5, dash=True)
        c.text(16, y + 31, f"{s} · {n} tokens", 22, bold=True)
        c.text(x0, y + 31, "no blocks: its tokens will be prefilled again", 22,
               italic=True, fill=MUTED)
        text.append(f"  {s:<3} {n:>3} tokens   no blocks: prefilled again later")
        y += ROW_H + 8
    return y


def _pool(c: Canvas, st: PoolState, colors: dict[str, str], marks: Marks, y: float,
          text: list[str]) -> float:
    v, bs = st.view, st.view.block_size
    used = sum(1 for b in v.blocks if b.ref_count)
    head = (f"physical blocks (the pool): {v.num_blocks} × {bs} slots · "
            f"{used} in use · {v.num_blocks - used} free")
    c.text(4, y + 26, head, 24, bold=True)
    text.append(head.replace("×", "x").replace(" · ", ", "))
    y += 38
    cols = v.num_blocks if v.num_blocks <= 12 else math.ceil(v.num_blocks / 2)
    box_w, box_h = (c.width - 4) / cols - 10, 84
    for blk in v.blocks:
        b, owners, ref, hashed = blk.block, blk.owners, blk.ref_count, blk.block in v.hashed
        x, by = 4 + (b % cols) * (box_w + 10), y + (b // cols) * (box_h + 10)
        copy_of = marks.copies.get(b)
        stroke, width = (COPY_MARK, 5) if copy_of is not None else ((INK, 2.5) if ref else
                                                                     (LINE, 2))
        c.rect(x, by, box_w, box_h, stroke=stroke, width=width, dash=copy_of is not None)
        c.text(x + 8, by + 25, f"#{b}", 22, bold=True, fill=INK if ref else MUTED)
        if ref > 1:
            c.text(x + box_w - 8, by + 25, f"×{ref}", 22, anchor="end", bold=True)
        slot_w = (box_w - 16 - (bs - 1) * 4) / bs
        color = colors[owners[0]] if len(owners) == 1 else SHARED if owners else KEPT
        for k in range(bs):
            written = b * bs + k in marks.written
            c.rect(x + 8 + k * (slot_w + 4), by + 33, slot_w, 22,
                   fill=color if k < blk.filled else PAPER, stroke=INK if written else LINE,
                   width=4 if written else 1.5, rx=2)
        said = (f"copy of #{copy_of}" if copy_of is not None else
                " ".join(owners) if owners else "free")  # the text twin keeps the full label
        lx = x + 8
        if hashed:
            c.circle(x + 16, by + 71, 8, HASH_MARK)
            lx += 18
        label = said if text_width(said, 20) <= box_w - (lx - x) - 4 else \
            said.replace("copy of ", "from ")   # a narrow box
        c.text(lx, by + 77, label, 20, fill=INK if ref else MUTED)
        slots = "".join(_slot_char(owners, k < blk.filled, hashed) for k in range(bs))
        if ref or hashed:
            text.append(f"  #{b:<3} {slots}  " + (f"x{ref}" if ref > 1 else "  ") + f"  {said}"
                        + (" (prefix hash)" if hashed else ""))
    free = [b.block for b in v.blocks if not b.ref_count and b.block not in v.hashed]
    if free:
        text.append("  free: " + " ".join(f"#{b}" for b in free))
    return y + math.ceil(v.num_blocks / cols) * (box_h + 10) - 4


def _slot_char(owners, filled: bool, hashed: bool) -> str:
    if not filled:
        return "."
    if not owners:
        return "c" if hashed else "."
    return owners[0][-1] if len(owners) == 1 else "*"


def _legend_items(st: PoolState, marks: Marks) -> list[tuple[str, str, str]]:
    items = [("box", PAPER, "empty slot")]
    if any(len(b.owners) > 1 for b in st.view.blocks):
        items.append(("box", SHARED, "slots of a shared block (×n: reference count)"))
    if any(b.state == "cached" for b in st.view.blocks):
        items.append(("box", KEPT, "free, K/V kept for the prefix cache"))
    if st.view.hashed:
        items.append(("dot", HASH_MARK, "block has a prefix hash"))
    if marks.copies:
        items.append(("dashed", PAPER, "copy-on-write copy"))
    if marks.written:
        items.append(("bold", PAPER, "slot written this step"))
    return items
