"""The block-table diagram of the slides: each sequence's block table above the physical pool.

What it teaches: nothing new; it draws a ``KVCacheManager``'s state for ``figures.py``, read
through the manager's public methods only (``seq_ids``, ``block_table``, ``seq_len``,
``ref_count``, ``is_swapped``, ``cpu_block_table``, ``allocator.cached_blocks()``), so the
picture cannot show anything the manager does not hold. Top: one row per sequence, its logical
blocks left to right, each naming the physical block it maps to. Bottom: the pool, one box per
physical block with its slots (filled in the colour of the sequence that wrote them, dark when
several sequences share the block), its reference count (``×n`` when above 1), a dot when the
prefix cache holds its hash, and a dashed outline when it is this step's copy-on-write copy.
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


@dataclass
class PoolState:
    """A snapshot of one manager (names are the manager's seq ids, as strings)."""

    block_size: int
    num_blocks: int
    tables: dict[str, list[int]]               # on the GPU, in the manager's order
    lens: dict[str, int]                       # tokens of every sequence shown
    swapped: dict[str, list[int]] = field(default_factory=dict)  # seq -> its CPU blocks
    waiting: dict[str, int] = field(default_factory=dict)        # recompute: tokens kept
    ref: list[int] = field(default_factory=list)
    hashed: set[int] = field(default_factory=set)                # blocks with a prefix hash
    cpu_note: str = ""

    def owners(self, block: int) -> list[str]:
        return [s for s, t in self.tables.items() if block in t]

    def filled(self, block: int) -> int:
        """Slots of ``block`` holding K/V: the most any sequence holding it has written."""
        bs, best = self.block_size, 0
        for s, t in self.tables.items():
            for i, b in enumerate(t):
                if b == block:
                    best = max(best, min(bs, self.lens[s] - i * bs))
        if not best and block in self.hashed:  # free but cached: a full block's K/V kept
            best = bs
        return best


def read_state(manager, waiting: dict | None = None) -> PoolState:
    """The state ``draw`` needs, from a KVCacheManager's public methods. ``waiting``: sequences
    preempted by recomputation (the manager forgot them; the caller keeps their tokens)."""
    tables, swapped, lens = {}, {}, {}
    for s in manager.seq_ids:
        lens[str(s)] = manager.seq_len(s)
        if manager.is_swapped(s):
            swapped[str(s)] = manager.cpu_block_table(s)
        else:
            tables[str(s)] = manager.block_table(s)
    cached = getattr(manager.allocator, "cached_blocks", None)
    hashed = set(cached().values()) if cached is not None else set()
    waiting = {str(s): len(t) for s, t in (waiting or {}).items()}
    return PoolState(manager.block_size, manager.num_blocks, tables, {**lens, **waiting},
                     swapped, waiting, [manager.ref_count(b) for b in range(manager.num_blocks)],
                     hashed)


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
    c.text(4, 26, "block tables (logical block → physical block)", 24, bold=True)
    text.append("block tables (logical block -> physical block)")
    rows = [*st.tables, *st.swapped, *st.waiting]
    most = max([len(t) for t in [*st.tables.values(), *st.swapped.values()]] + [1])
    x0 = CHIP_W + 16
    cell_w = min(96.0, (c.width - x0) / most - 8)
    c.text(4, 56, "logical block", 20, fill=MUTED)
    for i in range(most):
        c.text(x0 + i * (cell_w + 8) + cell_w / 2, 56, str(i), 20, anchor="middle", fill=MUTED)
    y = 66
    for s in rows:
        color = colors[s]
        if s in st.tables:
            c.rect(4, y, CHIP_W, ROW_H, fill=color, stroke=INK, width=1.5)
            c.text(16, y + 31, f"{s} · {st.lens[s]} tokens", 22, bold=True, fill=TEXT_ON[color])
            for i, b in enumerate(st.tables[s]):
                cx = x0 + i * (cell_w + 8)
                c.rect(cx, y, cell_w, ROW_H, stroke=color, width=5)
                c.text(cx + cell_w / 2, y + 32, f"#{b}", 24, anchor="middle", bold=True)
            text.append(f"  {s:<3} {st.lens[s]:>3} tokens   " +
                        " ".join(f"#{b}" for b in st.tables[s]))
        elif s in st.swapped:
            c.rect(4, y, CHIP_W, ROW_H, stroke=color, width=5, dash=True)
            c.text(16, y + 31, f"{s} · swapped out", 22, bold=True)
            for i, b in enumerate(st.swapped[s]):
                cx = x0 + i * (cell_w + 8)
                c.rect(cx, y, cell_w, ROW_H, stroke=LINE, width=3, dash=True)
                c.text(cx + cell_w / 2, y + 32, f"cpu {b}", 22, anchor="middle")
            text.append(f"  {s:<3} swapped out: CPU blocks " +
                        " ".join(f"cpu {b}" for b in st.swapped[s]))
        else:
            c.rect(4, y, CHIP_W, ROW_H, stroke=color, width=5, dash=True)
            c.text(16, y + 31, f"{s} · {st.waiting[s]} tokens", 22, bold=True)
            c.text(x0, y + 31, "no blocks: its tokens will be prefilled again", 22,
                   italic=True, fill=MUTED)
            text.append(f"  {s:<3} {st.waiting[s]:>3} tokens   no blocks: prefilled again later")
        y += ROW_H + 8
    return y


def _pool(c: Canvas, st: PoolState, colors: dict[str, str], marks: Marks, y: float,
          text: list[str]) -> float:
    used = sum(1 for r in st.ref if r)
    head = (f"physical blocks (the pool): {st.num_blocks} × {st.block_size} slots · "
            f"{used} in use · {st.num_blocks - used} free")
    c.text(4, y + 26, head, 24, bold=True)
    text.append(head.replace("×", "x").replace(" · ", ", "))
    y += 38
    cols = st.num_blocks if st.num_blocks <= 12 else math.ceil(st.num_blocks / 2)
    box_w, box_h, bs = (c.width - 4) / cols - 10, 84, st.block_size
    for b in range(st.num_blocks):
        x, by = 4 + (b % cols) * (box_w + 10), y + (b // cols) * (box_h + 10)
        owners, ref, fill = st.owners(b), st.ref[b], st.filled(b)
        copy_of = marks.copies.get(b)
        stroke, width = (COPY_MARK, 5) if copy_of is not None else ((INK, 2.5) if ref else
                                                                     (LINE, 2))
        c.rect(x, by, box_w, box_h, stroke=stroke, width=width, dash=copy_of is not None)
        c.text(x + 8, by + 25, f"#{b}", 22, bold=True, fill=INK if ref else MUTED)
        if ref > 1:
            c.text(x + box_w - 8, by + 25, f"×{ref}", 22, anchor="end", bold=True)
        slot_w = (box_w - 16 - (bs - 1) * 4) / bs
        if len(owners) == 1:
            color = colors[owners[0]]
        else:
            color = SHARED if owners else KEPT
        for k in range(bs):
            written = b * bs + k in marks.written
            c.rect(x + 8 + k * (slot_w + 4), by + 33, slot_w, 22,
                   fill=color if k < fill else PAPER, stroke=INK if written else LINE,
                   width=4 if written else 1.5, rx=2)
        if copy_of is not None:
            label = f"copy of #{copy_of}"
        elif owners:
            label = " ".join(owners)
        else:
            label = "free"
        said = label                            # the text twin keeps the full label
        lx = x + 8
        if b in st.hashed:
            c.circle(x + 16, by + 71, 8, HASH_MARK)
            lx += 18
        if text_width(label, 20) > box_w - (lx - x) - 4:
            label = label.replace("copy of ", "from ")  # a narrow box
        c.text(lx, by + 77, label, 20, fill=INK if ref else MUTED)
        slots = "".join(_slot_char(owners, k < fill, b in st.hashed) for k in range(bs))
        if ref or b in st.hashed:
            text.append(f"  #{b:<3} {slots}  " + (f"x{ref}" if ref > 1 else "  ") + f"  {said}"
                        + (" (prefix hash)" if b in st.hashed else ""))
    free = [b for b in range(st.num_blocks) if not st.ref[b] and b not in st.hashed]
    if free:
        text.append("  free: " + " ".join(f"#{b}" for b in free))
    return y + math.ceil(st.num_blocks / cols) * (box_h + 10) - 4


def _slot_char(owners: list[str], filled: bool, hashed: bool) -> str:
    if not filled:
        return "."
    if not owners:
        return "c" if hashed else "."
    return owners[0][-1] if len(owners) == 1 else "*"


def _legend_items(st: PoolState, marks: Marks) -> list[tuple[str, str, str]]:
    items = [("box", PAPER, "empty slot")]
    if any(len(st.owners(b)) > 1 for b in range(st.num_blocks)):
        items.append(("box", SHARED, "slots of a shared block (×n: reference count)"))
    if any(not r and b in st.hashed for b, r in enumerate(st.ref)):
        items.append(("box", KEPT, "free, K/V kept for the prefix cache"))
    if st.hashed:
        items.append(("dot", HASH_MARK, "block has a prefix hash"))
    if marks.copies:
        items.append(("dashed", PAPER, "copy-on-write copy"))
    if marks.written:
        items.append(("bold", PAPER, "slot written this step"))
    return items
