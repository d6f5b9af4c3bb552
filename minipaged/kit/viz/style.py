"""Colours, glyphs and sequence labels: pictures that read the same with or without colour.

Every colour here comes with a letter or a glyph that says the same thing, so a picture printed
with ``NO_COLOR=1`` (rich honours it), on a black-and-white projector, or seen by a colour-blind
reader loses nothing. The colours are the Okabe-Ito palette (Okabe and Ito, "Color Universal
Design", 2008), chosen to stay distinct under the common kinds of colour blindness.

* Sequences get a letter (A, B, C ...) and a colour. The letter is the information; the colour
  only helps the eye group a sequence's blocks across the pool.
* Memory categories (the vLLM paper's Fig. 2, ``contiguous/usage.py``) get a glyph and a colour.
"""

from __future__ import annotations

from collections.abc import Hashable

from rich.style import Style

from minipaged._checks import check_int

OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
GREY = "#8C8C8C"
_DARK_TEXT = {"#E69F00", "#56B4E9", "#F0E442", "#CC79A7"}  # light backgrounds get black text

# One glyph per memory category. In a slot strip a token slot shows its sequence's letter and a
# reserved slot the lowercase letter; these glyphs are for waste bars and slots nobody owns.
CATEGORY_GLYPH = {"token": "█", "reserved": "▒", "internal_fragmentation": "×",
                  "external_fragmentation": "!", "free": "·"}
CATEGORY_STYLE = {
    "token": Style(color="#0072B2"),
    "reserved": Style(color="#56B4E9"),
    "internal_fragmentation": Style(color="#E69F00", bold=True),
    "external_fragmentation": Style(color="#D55E00", bold=True),
    "free": Style(color=GREY),
}
CATEGORY_SHORT = {"token": "tok", "reserved": "res", "internal_fragmentation": "int",
                  "external_fragmentation": "ext", "free": "free"}

# Block states in the physical memory map (``blocks.py``).
FREE_GLYPH = "·"    # on the free list, holds nothing anyone can find
CACHED_GLYPH = "○"  # free, but still holds a full block findable by its hash (prefix cache)
COPY_GLYPH = "⧉"    # destination of a copy-on-write this step
FILL_GLYPH = "█"    # a slot of a block holding a token
EMPTY_GLYPH = "·"   # a slot of a block not (yet) holding a token

FREE_STYLE = Style(color=GREY)
CACHED_STYLE = Style(color="#009E73", italic=True)
COPY_STYLE = Style(color="#D55E00", bold=True)
HEADING_STYLE = Style(bold=True)
NOTE_STYLE = Style(color=GREY, italic=True)

# The step log's kinds of event: a tag that reads without colour, and a colour.
EVENT_TAG = {
    "admit": ("+ admit", "#009E73"),
    "append": ("> append", "#0072B2"),
    "block": ("# block", "#56B4E9"),
    "fork": ("Y fork", "#CC79A7"),
    "copy": ("= copy", "#D55E00"),
    "free": ("- free", GREY),
    "hit": ("* hit", "#009E73"),
    "evict": ("x evict", "#E69F00"),
    "preempt": ("! preempt", "#D55E00"),
    "swap": ("~ swap", "#E69F00"),
    "wait": (". wait", "#E69F00"),
    "check": ("= check", "#009E73"),
    "note": ("  note", GREY),
}


def seq_label(index: int) -> str:
    """The letter of the ``index``-th sequence: A .. Z, then a .. z, then A1, B1 ..."""
    index = check_int("index", index, low=0)
    if index < 26:
        return chr(65 + index)
    if index < 52:
        return chr(97 + index - 26)
    return f"{chr(65 + index % 26)}{index // 26 - 1}"


class Labels:
    """seq_id -> (label, colour), assigned in order of first sight and stable afterwards, so a
    sequence keeps its letter from frame to frame and the same seed gives the same letters."""

    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._names: dict[Hashable, str] = {}

    def name(self, seq_id: Hashable, name: str) -> None:
        """Give ``seq_id`` an explicit label ("R1", "B2", ...) instead of the next letter."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name={name!r} for seq_id={seq_id!r} must be a non-empty string")
        self._names[seq_id] = name
        self(seq_id)

    def __call__(self, seq_id: Hashable) -> str:
        i = self._index.setdefault(seq_id, len(self._index))
        return self._names.get(seq_id, seq_label(i))

    def letter(self, seq_id: Hashable) -> str:
        """One character for slot strips: the first character of the label."""
        return self(seq_id)[0]

    def style(self, seq_id: Hashable, *, dim: bool = False) -> Style:
        """The sequence's colour as a background with readable text on top; ``dim``: as the
        foreground only, for slots not yet written (an outline of what they will become)."""
        self(seq_id)
        colour = OKABE_ITO[self._index[seq_id] % len(OKABE_ITO)]
        if dim:
            return Style(color=colour)
        return Style(color="black" if colour in _DARK_TEXT else "white", bgcolor=colour,
                     bold=True)
