"""Pictures of where KV memory goes: contiguous arenas, slot strips and waste bars (vLLM Fig. 2).

* ``slot_strip``: any cache drawn one character per slot, so a contiguous arena and a paged pool
  of the same size line up column for column. A token slot shows its sequence's letter (``A``),
  a slot reserved for a future token the lowercase letter (``a``), a reserved slot the request
  will never reach ``×`` (internal fragmentation), a free slot that no reservation can use
  because it is not in the largest free region ``!`` (external fragmentation), a free slot ``·``.
* ``waste_bar``: the same five categories as one stacked bar per policy, with percentages.

Both read only views (``viz/state.py``) and ``KVUsage`` (``minipaged/usage.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from minipaged.contiguous.usage import CATEGORIES, KVUsage
from minipaged.kit.viz.labels import Labels
from minipaged.kit.viz.palette import (
    CATEGORY_GLYPH,
    CATEGORY_LABEL,
    CATEGORY_STYLE,
    HEADING_STYLE,
    NOTE_STYLE,
)


def slot_char(category: str, owner: Hashable | None, labels: Labels) -> Text:
    """One slot, as a character that reads without colour."""
    if category == "token" and owner is not None:
        return Text(labels.letter(owner), labels.style(owner))
    if category == "reserved" and owner is not None:
        return Text(labels.letter(owner).lower(), labels.style(owner, dim=True))
    return Text(CATEGORY_GLYPH[category], CATEGORY_STYLE[category])


def strip_row_len(width: int, num_slots: int) -> int:
    """64 slots a row at 80 columns and up (the label column takes 12), 32 below."""
    return max(1, min(num_slots, 64 if width >= 78 else 32))


def slot_strip(name: str, slots: Sequence[tuple[str, Hashable | None]], labels: Labels, *,
               width: int = 100, note: str = "") -> RenderableType:
    """A cache as rows of slots, ``name`` on the first row (policy or "paged")."""
    per_row = strip_row_len(width, len(slots))
    lines = []
    for start in range(0, len(slots), per_row):
        head = f"{name:<11} " if start == 0 else f"{start:>10}  "
        line = Text(head, HEADING_STYLE if start == 0 else NOTE_STYLE)
        for cat, owner in slots[start:start + per_row]:
            line.append_text(slot_char(cat, owner, labels))
        lines.append(line)
    if note:
        lines.append(Text(" " * 12 + note, NOTE_STYLE))
    return Group(*lines)


def strip_legend() -> Text:
    legend = Text("A token  a reserved (later token)  ", NOTE_STYLE)
    for cat in ("internal_fragmentation", "external_fragmentation", "free"):
        legend.append(CATEGORY_GLYPH[cat], CATEGORY_STYLE[cat])
        legend.append(f" {CATEGORY_LABEL[cat]}  ", NOTE_STYLE)
    return legend


def bar_segments(usage: KVUsage, length: int) -> list[tuple[str, int]]:
    """Split ``length`` characters among the categories in proportion to their slot counts.

    Largest-remainder rounding: the segments add up to exactly ``length``, and each segment is
    within one character of its exact share, so a bar never exaggerates a category by more than
    one character."""
    if length < 1:
        raise ValueError(f"length={length} must be >= 1")
    total = max(usage.total, 1)
    exact = [(c, getattr(usage, c) * length / total) for c in CATEGORIES]
    base = [(c, int(x)) for c, x in exact]
    short = length - sum(n for _, n in base) if usage.total else 0
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i][1] - base[i][1]), i))
    counts = [n for _, n in base]
    for i in order[:short]:
        counts[i] += 1
    if not usage.total:
        counts[CATEGORIES.index("free")] = length
    return [(c, n) for c, n in zip(CATEGORIES, counts)]


def waste_bar(usage: KVUsage, length: int) -> Text:
    bar = Text()
    for cat, n in bar_segments(usage, length):
        bar.append(CATEGORY_GLYPH[cat] * n, CATEGORY_STYLE[cat])
    return bar


def waste_bars(rows: Sequence[tuple[str, KVUsage]], *, width: int = 100,
               title: str = "where the memory goes (vLLM Fig. 2 categories)") -> RenderableType:
    """One stacked bar per policy, then each category's share in percent of all slots."""
    pct_cols = [c for c in CATEGORIES]
    # name 11 + 5 columns of 6 + padding; the bar takes what is left, at least 10 characters.
    length = max(10, min(40, width - 12 - 6 * len(pct_cols) - 8))
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style=NOTE_STYLE)
    table.add_column("", no_wrap=True)
    table.add_column("", no_wrap=True, width=length)
    for c in pct_cols:
        head = Text(CATEGORY_GLYPH[c], CATEGORY_STYLE[c])
        short = {"token": "tok", "reserved": "res", "internal_fragmentation": "int",
                 "external_fragmentation": "ext", "free": "free"}[c]
        head.append(f"{short}", NOTE_STYLE)
        table.add_column(head, justify="right", no_wrap=True)
    for name, usage in rows:
        fr = usage.fractions()
        table.add_row(Text(name, HEADING_STYLE), waste_bar(usage, length),
                      *[f"{100 * fr[c]:.0f}%" for c in pct_cols])
    return Group(Text(title, HEADING_STYLE), table)
