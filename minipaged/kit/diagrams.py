"""SVG diagrams for the slides: block tables and pools, usage bars, contiguous arenas, tables.

What it teaches: nothing about paging; it is the drawing half of ``figures.py``, which runs the
managers and hands their state to these functions. Each function returns a ``Drawing``: the SVG
and a plain-text twin of the same facts (for the terminal presenter and for review).

Written for a projector seen from the back of a room. Every SVG is drawn in the pixels it is
shown at: ``WIDTH`` wide, at most ``MAX_HEIGHT`` tall, so a deck slide showing it at
``![w:WIDTH]`` draws each font at its stated size, and no text is smaller than ``MIN_FONT`` px.
Colours are the Okabe-Ito palette (told apart with the common colour-vision deficiencies), each
with the text colour that contrasts with it. Text uses only glyphs that DejaVu Sans and
Liberation Sans both have (``GLYPHS``); marks such as a copy-on-write copy are drawn as shapes.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from itertools import groupby
from xml.sax.saxutils import escape

WIDTH = 1200
MAX_HEIGHT = 600
MIN_FONT = 20
FONT = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif"
# Beyond printable ASCII, the only characters a figure may print (both fonts have each one).
GLYPHS = frozenset("→×·–")
INK, MUTED, LINE, PAPER = "#111111", "#4d4d4d", "#8c8c8c", "#ffffff"
# Okabe-Ito colours for sequences, in order, with the text colour that reads on each.
SEQ_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442")
TEXT_ON = {"#0072B2": PAPER, "#E69F00": INK, "#009E73": PAPER, "#CC79A7": INK,
           "#D55E00": PAPER, "#56B4E9": INK, "#F0E442": INK, "#333333": PAPER,
           "#b8b8b8": INK, "#9ecae9": INK, PAPER: INK}
SHARED = "#333333"      # the slots of a block that several sequences share
KEPT = "#b8b8b8"        # the slots of a free block whose K/V a prefix cache keeps
HASH_MARK = INK         # the dot on a block that carries a prefix hash
COPY_MARK = "#D55E00"   # the dashed outline of a copy-on-write copy
# The paper's Fig. 2 categories (``contiguous/usage.py``), colour and short name.
CATEGORIES = (("token", "#0072B2", "token states"), ("reserved", "#9ecae9", "reserved"),
              ("internal_fragmentation", "#E69F00", "internal fragmentation"),
              ("external_fragmentation", "#D55E00", "external fragmentation"),
              ("free", PAPER, "free"))


@dataclass(frozen=True)
class Drawing:
    svg: str
    text: str


def twin(lines: list[str]) -> str:
    """The plain-text twin: lines as given, long ones wrapped for an 100-column terminal."""
    out = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        out += textwrap.wrap(line, 96, subsequent_indent=indent) if len(line) > 96 else [line]
    return "\n".join(out) + "\n"


# Advance widths of DejaVu Sans (the wider of the two fonts), in em; bold is about 10% wider.
_EM = {**dict.fromkeys("0123456789", 0.64), **dict.fromkeys("ijl.,:;'|!", 0.28),
       **dict.fromkeys("frt()-[]", 0.41), **dict.fromkeys("mw%#×→MW", 0.98),
       " ": 0.32, "·": 0.32, "+": 0.84, "=": 0.84, ">": 0.84, "<": 0.84}


def text_width(s: str, size: float, bold: bool = False) -> float:
    """An upper estimate of the width DejaVu Sans gives ``s`` at ``size`` px."""
    em = sum(_EM.get(ch, 0.76 if ch.isupper() else 0.64) for ch in s)
    return em * size * (1.1 if bold else 1.0)


def wrap(s: str, size: float, width: float, bold: bool = False) -> list[str]:
    """Greedy word wrap by estimated width."""
    lines, cur = [], ""
    for word in s.split():
        trial = f"{cur} {word}" if cur else word
        if cur and text_width(trial, size, bold) > width:
            lines.append(cur)
            cur = word
        else:
            cur = trial
    return lines + [cur] if cur or not lines else lines


class Canvas:
    """SVG elements in display pixels; the height grows to hold what is drawn."""

    def __init__(self, width: int = WIDTH) -> None:
        self.width, self.height, self.parts = width, 0.0, []

    def _grow(self, bottom: float) -> None:
        self.height = max(self.height, bottom)

    def rect(self, x, y, w, h, fill=PAPER, stroke=INK, width=2.0, dash=False, rx=4) -> None:
        d = ' stroke-dasharray="10 6"' if dash else ""
        self.parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                          f'rx="{rx}" fill="{fill}" stroke="{stroke}" '
                          f'stroke-width="{width}"{d}/>')
        self._grow(y + h + width)

    def line(self, x, y1, y2, width: float = 4.0) -> None:
        """A vertical line at ``x`` from ``y1`` to ``y2``."""
        self.parts.append(f'<line x1="{x:.1f}" y1="{y1:.1f}" x2="{x:.1f}" y2="{y2:.1f}" '
                          f'stroke="{INK}" stroke-width="{width}"/>')
        self._grow(y2)

    def circle(self, cx, cy, r, fill) -> None:
        self.parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r}" fill="{fill}" '
                          f'stroke="{INK}" stroke-width="1.5"/>')
        self._grow(cy + r)

    def text(self, x, y, s, size=24, *, anchor="start", bold=False, fill=INK,
             italic=False) -> None:
        """``s`` with its baseline at ``y``; refuses a size below MIN_FONT or a rare glyph."""
        if size < MIN_FONT:
            raise ValueError(f"font size {size} < {MIN_FONT} px: unreadable from the back")
        rare = {c for c in s if not (" " <= c <= "~") and c not in GLYPHS}
        if rare:
            raise ValueError(f"{s!r} uses {sorted(rare)}, outside the glyphs every font has")
        w = text_width(s, size, bold)
        left = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
        if left < 0 or left + w > self.width:
            raise ValueError(f"{s!r} at {size} px runs off the figure; shorten or wrap it")
        style = (' font-weight="bold"' if bold else "") + (' font-style="italic"' if italic
                                                           else "")
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" '
                          f'text-anchor="{anchor}" fill="{fill}"{style}>{escape(s)}</text>')
        self._grow(y + size * 0.3)

    def svg(self, title: str) -> str:
        h = int(self.height + 6)
        if h > MAX_HEIGHT:
            raise ValueError(f"a figure of height {h} > {MAX_HEIGHT} px would be shrunk on the "
                             f"slide; draw less")
        body = "\n".join(self.parts)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {h}" '
                f'width="{self.width}" height="{h}" font-family="{FONT}">\n'
                f'<title>{escape(title)}</title>\n'
                f'<rect width="{self.width}" height="{h}" fill="{PAPER}"/>\n{body}\n</svg>\n')


def caption(c: Canvas, y: float, lines: list[str], size: int = 24) -> float:
    """Wrapped lines of text from ``y`` down; returns the y below them."""
    for line in lines:
        for part in wrap(line, size, c.width - 8):
            y += size * 1.3
            c.text(4, y, part, size)
    return y


def legend(c: Canvas, y: float, items: list[tuple[str, str, str]], size: int = 20) -> float:
    """Rows of (kind, colour, label) swatches, kind one of "box", "dashed" (a copy-on-write
    outline), "bold" (a slot written this step), "dot" (a prefix hash); returns the y below."""
    x = 4
    for kind, color, label in items:
        w = 32 + text_width(label, size) + 28
        if x + w > c.width and x > 4:
            x, y = 4, y + 32
        if kind == "dot":
            c.circle(x + 12, y + 14, 8, color)
        else:
            c.rect(x, y + 2, 24, 24, fill=color, stroke=COPY_MARK if kind == "dashed" else INK,
                   width={"dashed": 3, "bold": 4}.get(kind, 1.5), dash=kind == "dashed", rx=2)
        c.text(x + 32, y + 22, label, size)
        x += w
    return y + 32


# ---- tables ---------------------------------------------------------------------------------
def table(title: str, header: list[str], rows: list[list[str]], *, size: int = 26,
          align: str = "", notes: list[str] = ()) -> Drawing:
    """A table with a bold header and a bold first column; long cells wrap. Column widths
    follow the text; ``align`` has one letter per column, "l" (the default) or "r"."""
    c, pad = Canvas(), 12
    natural = [max(text_width(r[i], size, r is header or i == 0) for r in [header, *rows])
               + 2 * pad for i in range(len(header))]
    widths = _fit(natural, c.width - 8)
    y = caption(c, -8, [title], 26) + 14
    for r, row in enumerate([header, *rows]):
        cells = [wrap(s, size, w - 2 * pad, r == 0 or i == 0)
                 for i, (s, w) in enumerate(zip(row, widths))]
        h = max(len(x) for x in cells) * size * 1.3 + 14
        x = 4
        for i, (lines, w) in enumerate(zip(cells, widths)):
            c.rect(x, y, w, h, fill="#e6e6e6" if r == 0 else PAPER, stroke=LINE, width=1.5,
                   rx=0)
            for k, line in enumerate(lines):
                right = r > 0 and align[i:i + 1] == "r"
                c.text(x + w - pad if right else x + pad, y + 7 + (k + 1) * size * 1.3 - 6,
                       line, size, anchor="end" if right else "start", bold=r == 0 or i == 0)
            x += w
        y += h
    caption(c, y + 4, list(notes), 22)
    text = [title, ""] + ["  ".join(row) for row in [header, *rows]] + list(notes)
    return Drawing(c.svg(title), twin(text))


def _fit(natural: list[float], room: float) -> list[float]:
    """Column widths that fill at most ``room``: the widest columns give way first (each is
    capped at one width, the largest cap that fits), so short columns never wrap."""
    if sum(natural) <= room:
        return natural
    lo, hi = 0.0, max(natural)
    for _ in range(40):                         # bisect the cap
        cap = (lo + hi) / 2
        lo, hi = (cap, hi) if sum(min(n, cap) for n in natural) <= room else (lo, cap)
    return [min(n, lo) for n in natural]


# ---- usage bars (the paper's Fig. 2 categories) ---------------------------------------------
def usage_bars(title: str, rows: list[tuple[str, dict[str, float]]],
               notes: list[str] = ()) -> Drawing:
    """One stacked bar per policy: the share of every slot category, labelled in percent."""
    c = Canvas()
    y = caption(c, -8, [title], 26) + 16
    label_w, bar_w, bar_h = 250, c.width - 260, 60
    text = [title, ""]
    for label, fr in rows:
        c.text(4, y + 40, label, 26, bold=True)
        x = label_w
        for key, color, _ in CATEGORIES:
            w = bar_w * fr.get(key, 0.0)
            if w <= 0:
                continue
            c.rect(x, y, w, bar_h, fill=color, stroke=INK, width=1.5, rx=0)
            if w >= 70:
                c.text(x + w / 2, y + 40, f"{100 * fr[key]:.0f}%", 24, anchor="middle",
                       bold=True, fill=TEXT_ON[color])
            x += w
        y += bar_h + 18
        text.append(f"{label:<14} " + "  ".join(f"{key.split('_')[0]} {100 * fr.get(key, 0):.0f}%"
                                                for key, _, _ in CATEGORIES))
    y = legend(c, y, [("box", color, name) for _, color, name in CATEGORIES])
    caption(c, y, list(notes), 22)
    return Drawing(c.svg(title), twin(text + list(notes)))


# ---- a contiguous arena, slot by slot ---------------------------------------------------------
def arena_strips(rows: list[tuple[str, list[tuple[str, str | None]], str]], *, title: str,
                 notes: list[str] = (), per_row: int = 64) -> Drawing:
    """Each row: (policy, [(category, request letter or None)] per slot, status line). Slots
    are coloured by category; each run of a request's token slots carries its letter."""
    c = Canvas()
    y = caption(c, -8, [title], 26) + 10
    label_w = 150
    slot_w = (c.width - label_w - 4) / per_row
    colors = {k: col for k, col, _ in CATEGORIES}
    text = [title, ""]
    for policy, slots, status in rows:
        c.text(4, y + 30, policy, 26, bold=True)
        for start in range(0, len(slots), per_row):
            chunk = slots[start:start + per_row]
            for i, (cat, _who) in enumerate(chunk):
                c.rect(label_w + i * slot_w, y, slot_w, 36, fill=colors[cat], stroke=LINE,
                       width=0.75, rx=0)
            for i in range(1, len(chunk)):      # a bold line where one request's slots end
                if chunk[i][1] != chunk[i - 1][1]:
                    c.line(label_w + i * slot_w, y - 3, y + 39)
            i = 0
            for (cat, who), run in groupby(chunk):  # each run of one request's token slots
                j = i + len(list(run))
                if cat == "token" and who and (j - i) * slot_w >= 26:
                    c.text(label_w + (i + j) / 2 * slot_w, y + 27, who, 22, anchor="middle",
                           bold=True, fill=TEXT_ON[colors[cat]])
                i = j
            text.append(f"{policy:<7} " + "".join(_slot_char(cat, who) for cat, who in chunk))
            policy = ""
            y += 40
        c.text(4, y + 20, status, 20, fill=MUTED)
        text.append(" " * 8 + status)
        y += 34
    y = legend(c, y + 2, [("box", col, name) for _, col, name in CATEGORIES])
    caption(c, y, list(notes), 22)
    text.append("A: a request's tokens, a: reserved for it, x: internal fragmentation, "
                "!: external fragmentation, .: free")
    return Drawing(c.svg(title), twin(text + list(notes)))


def _slot_char(cat: str, who: str | None) -> str:
    return {"token": who or "#", "reserved": (who or "r").lower(),
            "internal_fragmentation": "x", "external_fragmentation": "!", "free": "."}[cat]
