"""Pictures of the paged cache: block tables and the physical memory map (vLLM section 4.2-4.3).

Two pictures of the same state, drawn from a ``PoolView`` (``viz/state.py``):

* ``block_tables``: one row per sequence, its logical blocks left to right, each naming the
  physical block it lives in (``#5``) and how many of its slots hold tokens (``███·``). This is
  the sequence's view: contiguous, in order.
* ``memory_map``: the pool as the GPU sees it: physical blocks 0 .. NB-1 in a grid, each showing
  its owner, its reference count when shared (``A×3``), or that it is free (``·``), cached but
  free (``○``, prefix caching) or the destination of a copy-on-write this step (``⧉``).

Seeing both side by side is the whole idea of paging: the first is contiguous, the second is not,
and the block table is the only thing connecting them.

Cell format of the memory map, one block per cell (tests parse it back):

    line 1: "<id> <tag>"  tag = owner label + "×<ref_count>" when shared, or "·" / "○"
    line 2: fill glyphs, one per slot (BS <= 8), else "<filled>/<BS>"; "⧉<src>" when copied in
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from minipaged.kit.viz.labels import Labels
from minipaged.kit.viz.palette import (
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
)
from minipaged.kit.viz.state import PoolView, TableView


def fill_text(filled: int, block_size: int) -> str:
    """``███·`` for 3 of 4 slots; ``11/16`` when blocks are too wide to draw slot by slot."""
    if block_size <= 8:
        return FILL_GLYPH * filled + EMPTY_GLYPH * (block_size - filled)
    return f"{filled}/{block_size}"


def block_tag(view: PoolView, block: int, labels: Labels) -> str:
    """The text naming what a physical block holds (line 1 of its memory-map cell, after the id)."""
    b = view.blocks[block]
    if b.state == "free":
        return FREE_GLYPH
    if b.state == "cached":
        return CACHED_GLYPH
    if b.state == "held":
        return f"src×{b.ref_count}"
    tag = labels(b.owners[0])
    if b.ref_count > 1:
        tag += f"×{b.ref_count}"
    return tag


def blocks_per_row(width: int, num_blocks: int) -> int:
    """8 blocks a row fits 80 columns with room to spare; narrower terminals get 4."""
    per_row = 8 if width >= 72 else 4
    return max(1, min(per_row, num_blocks))


def memory_map(view: PoolView, labels: Labels, *, width: int = 100,
               title: str = "physical blocks (the pool)",
               highlight: Sequence[int] = ()) -> RenderableType:
    """The pool as a grid of physical blocks, coloured and labelled by owner. Blocks in
    ``highlight`` (the ones being read this step) get a ``◀`` after their fill."""
    per_row = blocks_per_row(width, view.num_blocks)
    grid = Table.grid(padding=(0, 1))
    for _ in range(per_row):
        grid.add_column(no_wrap=True, min_width=7)
    row: list[Text] = []
    for b in view.blocks:
        tag = block_tag(view, b.block, labels)
        top = Text(f"{b.block:>2} ")
        if b.state == "used":
            top.append(tag, labels.style(b.owners[0]))
        elif b.state == "held":
            top.append(tag, COPY_STYLE)
        else:
            top.append(tag, CACHED_STYLE if b.state == "cached" else FREE_STYLE)
        bottom = Text("   ")
        if b.state == "used" or b.state == "cached":
            style = labels.style(b.owners[0], dim=True) if b.owners else CACHED_STYLE
            bottom.append(fill_text(b.filled, view.block_size), style)
        if b.copy_from is not None:
            bottom.append(f"{COPY_GLYPH}{b.copy_from}", COPY_STYLE)
        if b.block in highlight:
            bottom.append("◀", COPY_STYLE)
        row.append(Text("\n").join([top, bottom]))
        if len(row) == per_row:
            grid.add_row(*row)
            row = []
    if row:
        grid.add_row(*row, *[Text("")] * (per_row - len(row)))
    used = sum(1 for b in view.blocks if b.state == "used")
    head = Text.assemble((title, HEADING_STYLE),
                         f": {view.num_blocks} blocks × {view.block_size} slots, "
                         f"{used} in use, {view.num_free} free")
    legend = Text("letter: owning sequence   ×n: reference count   ·: free", NOTE_STYLE)
    if any(b.state == "cached" for b in view.blocks):
        legend.append(f"   {CACHED_GLYPH}: free but cached (prefix hash kept)")
    if view.copies:
        legend.append(f"   {COPY_GLYPH}n: copied from block n (copy-on-write)")
    if highlight:
        legend.append("   ◀: read this step")
    return Group(head, grid, legend)


def block_tables(view: PoolView, labels: Labels, *, seq_ids: Sequence[Hashable] | None = None,
                 vocab: Sequence[str] | None = None, width: int = 100,
                 final_lens: Mapping[Hashable, int] | None = None,
                 title: str = "block tables (logical -> physical)",
                 joiner: str = " ") -> RenderableType:
    """Each sequence's logical blocks, left to right, naming the physical block they live in.

    With ``vocab`` (token id -> text) each sequence's tokens are printed under its row, split at
    block boundaries with ``|``, so a reader sees which words a block holds. ``joiner`` goes
    between tokens: a space for words, "" for characters (a character-level tokenizer)."""
    tables = [view.table(s) for s in seq_ids] if seq_ids is not None else list(view.tables)
    max_blocks = max((len(t.blocks) for t in tables), default=0)
    # A column is about 6 characters wide; beyond what fits, the last column says "+n more".
    fit = max(1, (width - 16) // 7)
    shown = min(max_blocks, fit)
    table = Table(box=None, padding=(0, 1), show_edge=False, title=None,
                  header_style=NOTE_STYLE)
    table.add_column("seq", no_wrap=True)
    for i in range(shown):
        table.add_column(f"L{i}", no_wrap=True)
    if max_blocks > shown:
        table.add_column("", no_wrap=True)
    for t in tables:
        cells: list[RenderableType] = [_seq_cell(t, labels, final_lens)]
        for i in range(shown):
            cells.append(_block_cell(t, i, view.block_size, labels) if i < len(t.blocks)
                         else Text(""))
        if max_blocks > shown:
            more = len(t.blocks) - shown
            cells.append(Text(f"+{more} more" if more > 0 else "", NOTE_STYLE))
        table.add_row(*cells)
    parts: list[RenderableType] = [Text(title, HEADING_STYLE), table]
    if vocab is not None:
        for t in tables:
            parts.append(token_line(t, view.block_size, labels, vocab, width, joiner=joiner))
    if not tables:
        parts.append(Text("(no sequences)", NOTE_STYLE))
    return Group(*parts)


def _seq_cell(t: TableView, labels: Labels, final_lens: Mapping[Hashable, int] | None) -> Text:
    text = Text(labels(t.seq_id), labels.style(t.seq_id))
    text.append(f" len {t.seq_len}")
    if final_lens is not None and t.seq_id in final_lens:
        text.append(f"/{final_lens[t.seq_id]}", NOTE_STYLE)
    return text


def _block_cell(t: TableView, i: int, block_size: int, labels: Labels) -> Text:
    filled = max(0, min(block_size, t.seq_len - i * block_size))
    cell = Text(f"#{t.blocks[i]}", labels.style(t.seq_id))
    cell.append("\n")
    cell.append(fill_text(filled, block_size), labels.style(t.seq_id, dim=True))
    return cell


def token_line(t: TableView, block_size: int, labels: Labels, vocab: Sequence[str],
               width: int, *, joiner: str = " ") -> Text:
    """``A: the cat sat on | a mat .`` : the sequence's tokens, a bar at each block boundary
    (with ``joiner=""``, for characters: ``A: coun|t do|wn``)."""
    line = Text(f"{labels(t.seq_id)}: ", labels.style(t.seq_id, dim=True))
    words = []
    for pos, tok in enumerate(t.token_ids):
        if pos and pos % block_size == 0:
            words.append("|")
        words.append(vocab[tok % len(vocab)])
    line.append(joiner.join(words))
    line.truncate(width, overflow="ellipsis")
    return line


def cpu_pool(view: PoolView, labels: Labels) -> RenderableType:
    """Sequences swapped out to the CPU block pool (vLLM section 4.5), with their CPU blocks."""
    if not view.swapped:
        return Text("CPU pool: empty", NOTE_STYLE)
    lines = [Text("CPU pool (swapped out)", HEADING_STYLE)]
    for t in view.swapped:
        line = Text("  ")
        line.append(labels(t.seq_id), labels.style(t.seq_id))
        line.append(f" len {t.seq_len}: ")
        line.append(" ".join(f"cpu#{b}" for b in t.blocks) or "(no blocks)")
        lines.append(line)
    return Group(*lines)
