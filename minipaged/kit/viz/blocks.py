"""Pictures of the paged cache: block tables and the physical memory map (vLLM sections 4.2-4.3).

Two pictures of the same ``PoolView`` (``state.py``):

* ``block_tables``: one row per sequence, its logical blocks left to right, each naming the
  physical block it lives in (``#5``) and how many of its slots hold tokens (``███·``): the
  sequence's view, contiguous and in order.
* ``memory_map``: the pool as the GPU sees it, physical blocks 0 .. NB-1 in a grid, each showing
  its owner, its reference count when shared (``A×3``), or that it is free (``·``), free but
  cached (``○``, prefix caching) or the destination of a copy-on-write this step (``⧉``).

Side by side they are the whole idea of paging: the first is contiguous, the second is not, and
the block table is the only thing connecting them. Memory-map cell format (tests parse it back):
line 1 ``<id> <tag>``, tag = owner label + ``×<ref_count>`` when shared, or ``·`` / ``○``;
line 2 the fill, one glyph per slot (``<filled>/<BS>`` when BS > 8), ``⧉<src>`` when copied in.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from minipaged.kit.viz.state import PoolView, TableView
from minipaged.kit.viz.style import (
    CACHED_GLYPH,
    CACHED_STYLE,
    COPY_GLYPH,
    COPY_STYLE,
    EMPTY_GLYPH,
    FILL_GLYPH,
    FREE_GLYPH,
    FREE_STYLE,
    HEADING_STYLE,
    NOTE_STYLE,
    Labels,
)


def fill_text(filled: int, block_size: int) -> str:
    """``███·`` for 3 of 4 slots; ``11/16`` when blocks are too wide to draw slot by slot."""
    if block_size <= 8:
        return FILL_GLYPH * filled + EMPTY_GLYPH * (block_size - filled)
    return f"{filled}/{block_size}"


def _cell(view: PoolView, b, labels: Labels, highlight: Sequence[int]) -> Text:
    if b.state == "used":
        tag = labels(b.owners[0]) + (f"×{b.ref_count}" if b.ref_count > 1 else "")
        style = labels.style(b.owners[0])
    elif b.state == "held":
        tag, style = f"src×{b.ref_count}", COPY_STYLE
    elif b.state == "cached":
        tag, style = CACHED_GLYPH, CACHED_STYLE
    else:
        tag, style = FREE_GLYPH, FREE_STYLE
    top = Text(f"{b.block:>2} ").append(tag, style)
    bottom = Text("   ")
    if b.state in ("used", "cached"):
        fill_style = labels.style(b.owners[0], dim=True) if b.owners else CACHED_STYLE
        bottom.append(fill_text(b.filled, view.block_size), fill_style)
    if b.copy_from is not None:
        bottom.append(f"{COPY_GLYPH}{b.copy_from}", COPY_STYLE)
    if b.block in highlight:
        bottom.append("◀", COPY_STYLE)
    return Text("\n").join([top, bottom])


def memory_map(view: PoolView, labels: Labels, *, width: int = 100,
               highlight: Sequence[int] = ()) -> RenderableType:
    """The pool as a grid of physical blocks, 8 a row (4 below 72 columns); blocks in
    ``highlight`` (read this step) get a ``◀``."""
    per_row = max(1, min(8 if width >= 72 else 4, view.num_blocks))
    grid = Table.grid(padding=(0, 1))
    for _ in range(per_row):
        grid.add_column(no_wrap=True, min_width=7)
    cells = [_cell(view, b, labels, highlight) for b in view.blocks]
    cells += [Text("")] * (-len(cells) % per_row)
    for i in range(0, len(cells), per_row):
        grid.add_row(*cells[i:i + per_row])
    used = sum(1 for b in view.blocks if b.state == "used")
    head = Text.assemble(("physical blocks (the pool)", HEADING_STYLE),
                         f": {view.num_blocks} blocks × {view.block_size} slots, {used} in use, "
                         f"{view.num_free} free")
    legend = Text("letter: owning sequence   ×n: reference count   ·: free", NOTE_STYLE)
    if any(b.state == "cached" for b in view.blocks):
        legend.append(f"   {CACHED_GLYPH}: free but cached (prefix hash kept)")
    if view.copies:
        legend.append(f"   {COPY_GLYPH}n: copied from block n (copy-on-write)")
    if highlight:
        legend.append("   ◀: read this step")
    return Group(head, grid, legend)


def block_tables(view: PoolView, labels: Labels, *, vocab: Sequence[str] | None = None,
                 width: int = 100, final_lens: Mapping[Hashable, int] | None = None,
                 joiner: str = " ") -> RenderableType:
    """Each sequence's logical blocks, left to right, naming the physical block they live in.

    With ``vocab`` (token id -> text) each sequence's tokens are printed under the table, split
    at block boundaries with ``|``; ``joiner`` goes between tokens ("" for characters)."""
    max_blocks = max((len(t.blocks) for t in view.tables), default=0)
    shown = min(max_blocks, max(1, (width - 16) // 7))  # a column is about 7 characters wide
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style=NOTE_STYLE)
    table.add_column("seq", no_wrap=True)
    for i in range(shown):
        table.add_column(f"L{i}", no_wrap=True)
    if max_blocks > shown:
        table.add_column("", no_wrap=True)
    for t in view.tables:
        head = Text(labels(t.seq_id), labels.style(t.seq_id)).append(f" len {t.seq_len}")
        if final_lens is not None and t.seq_id in final_lens:
            head.append(f"/{final_lens[t.seq_id]}", NOTE_STYLE)
        cells: list[RenderableType] = [head]
        for i in range(shown):
            filled = max(0, min(view.block_size, t.seq_len - i * view.block_size))
            cells.append(Text.assemble((f"#{t.blocks[i]}", labels.style(t.seq_id)), "\n",
                                       (fill_text(filled, view.block_size),
                                        labels.style(t.seq_id, dim=True)))
                         if i < len(t.blocks) else Text(""))
        if max_blocks > shown:
            more = len(t.blocks) - shown
            cells.append(Text(f"+{more} more" if more > 0 else "", NOTE_STYLE))
        table.add_row(*cells)
    parts: list[RenderableType] = [Text("block tables (logical -> physical)", HEADING_STYLE),
                                   table]
    if not view.tables:
        parts.append(Text("(no sequences)", NOTE_STYLE))
    if vocab is not None:
        parts += [token_line(t, view.block_size, labels, vocab, width, joiner=joiner)
                  for t in view.tables]
    return Group(*parts)


def token_line(t: TableView, block_size: int, labels: Labels, vocab: Sequence[str],
               width: int, *, joiner: str = " ") -> Text:
    """``A: the cat sat on | a mat .``: the sequence's tokens, a bar at each block boundary."""
    words = []
    for pos, tok in enumerate(t.token_ids):
        if pos and pos % block_size == 0:
            words.append("|")
        words.append(vocab[tok % len(vocab)])
    line = Text(f"{labels(t.seq_id)}: ", labels.style(t.seq_id, dim=True))
    line.append(joiner.join(words))
    line.truncate(width, overflow="ellipsis")
    return line


def cpu_pool(view: PoolView, labels: Labels) -> RenderableType:
    """Sequences swapped out to the CPU block pool (vLLM section 4.5), with their CPU blocks."""
    if not view.swapped:
        return Text("CPU pool: empty", NOTE_STYLE)
    lines = [Text("CPU pool (swapped out)", HEADING_STYLE)]
    for t in view.swapped:
        line = Text("  ").append(labels(t.seq_id), labels.style(t.seq_id))
        line.append(f" len {t.seq_len}: " + (" ".join(f"cpu#{b}" for b in t.blocks)
                                             or "(no blocks)"))
        lines.append(line)
    return Group(*lines)
