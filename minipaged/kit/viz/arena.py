"""Pictures of where KV memory goes: slot strips and waste bars (vLLM Fig. 2 categories).

* ``slot_strip``: a cache drawn one character per slot, so a contiguous arena and a paged pool of
  the same size line up column for column. A token slot shows its sequence's letter (``A``), a
  slot reserved for a token the request will still produce the lowercase letter (``a``), a slot
  reserved that the request will never reach ``×`` (internal fragmentation), a free slot in a
  buddy block too small for the next waiting request's region ``!`` (external fragmentation),
  any other free slot ``·``.
* ``waste_bars``: the same five categories as one stacked bar per cache, with percentages.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from minipaged._checks import check_int
from minipaged.contiguous.usage import CATEGORIES, KVUsage
from minipaged.kit.viz.style import (
    CATEGORY_GLYPH,
    CATEGORY_SHORT,
    CATEGORY_STYLE,
    HEADING_STYLE,
    NOTE_STYLE,
    Labels,
)


def slot_strip(name: str, slots: Sequence[tuple[str, Hashable | None]], labels: Labels, *,
               width: int = 100, note: str = "") -> RenderableType:
    """A cache as rows of slots (64 a row from 78 columns, else 32), ``name`` on the first."""
    per_row = max(1, min(len(slots), 64 if width >= 78 else 32))
    lines = []
    for start in range(0, len(slots), per_row):
        line = Text(f"{name:<11} " if start == 0 else f"{start:>10}  ",
                    HEADING_STYLE if start == 0 else NOTE_STYLE)
        for cat, owner in slots[start:start + per_row]:
            if cat == "token" and owner is not None:
                line.append(labels.letter(owner), labels.style(owner))
            elif cat == "reserved" and owner is not None:
                line.append(labels.letter(owner).lower(), labels.style(owner, dim=True))
            else:
                line.append(CATEGORY_GLYPH[cat], CATEGORY_STYLE[cat])
        lines.append(line)
    if note:
        lines.append(Text(" " * 12 + note, NOTE_STYLE))
    return Group(*lines)


def strip_legend() -> Text:
    legend = Text("A token  a reserved (a token to come)  ", NOTE_STYLE)
    for cat, words in (("internal_fragmentation", "reserved, never used"),
                       ("external_fragmentation", "free, pieces too small"), ("free", "free")):
        legend.append(CATEGORY_GLYPH[cat], CATEGORY_STYLE[cat])
        legend.append(f" {words}  ", NOTE_STYLE)
    return legend


def bar_segments(usage: KVUsage, length: int) -> list[tuple[str, int]]:
    """Split ``length`` characters among the categories in proportion to their slot counts.

    Largest-remainder rounding: the segments add up to exactly ``length`` and each is within one
    character of its exact share, so a bar never exaggerates a category by a whole character."""
    length = check_int("length", length, low=1)
    if not usage.total:
        return [(c, length if c == "free" else 0) for c in CATEGORIES]
    exact = [getattr(usage, c) * length / usage.total for c in CATEGORIES]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[:length - sum(counts)]:
        counts[i] += 1
    return list(zip(CATEGORIES, counts))


def waste_bars(rows: Sequence[tuple[str, KVUsage]], *, width: int = 100,
               title: str = "where the memory goes (vLLM Fig. 2 categories)") -> RenderableType:
    """One stacked bar per cache, then each category's share in percent of all slots."""
    length = max(10, min(40, width - 12 - 6 * len(CATEGORIES) - 8))  # what the columns leave
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style=NOTE_STYLE)
    table.add_column("", no_wrap=True)
    table.add_column("", no_wrap=True, width=length)
    for c in CATEGORIES:
        table.add_column(Text(CATEGORY_GLYPH[c], CATEGORY_STYLE[c]).append(CATEGORY_SHORT[c],
                                                                           NOTE_STYLE),
                         justify="right", no_wrap=True)
    for name, usage in rows:
        bar = Text()
        for cat, n in bar_segments(usage, length):
            bar.append(CATEGORY_GLYPH[cat] * n, CATEGORY_STYLE[cat])
        fr = usage.fractions()
        table.add_row(Text(name, HEADING_STYLE), bar, *[f"{100 * fr[c]:.0f}%" for c in CATEGORIES])
    return Group(Text(title, HEADING_STYLE), table)
