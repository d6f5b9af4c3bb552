"""Colours and glyphs for the classroom pictures, readable with or without colour.

Every colour here comes with a glyph or a label that says the same thing, so that a picture
printed with ``NO_COLOR=1`` (rich honours it), on a black-and-white projector, or seen by a
colour-blind reader loses nothing. The colours are the Okabe-Ito palette (Okabe and Ito, "Color
Universal Design", 2008), chosen to stay distinct under the common kinds of colour blindness.

Two families of marks:

* Sequences get a letter (A, B, C ...) and a colour. The letter is the information; the colour
  only helps the eye group a sequence's blocks across the pool.
* Memory categories (the vLLM paper's Fig. 2, see ``minipaged/usage.py``) get a glyph and a
  colour: one slot of a contiguous arena, or one segment of a waste bar, is drawn with them.
"""

from __future__ import annotations

from rich.style import Style

# Okabe-Ito, in an order where neighbours contrast well.
OKABE_ITO = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#D55E00",  # vermillion
    "#F0E442",  # yellow
)
GREY = "#8C8C8C"

# Dark text on the light Okabe-Ito colours, light text on the dark ones: both read on a projector.
_DARK_TEXT = {"#E69F00", "#56B4E9", "#F0E442", "#CC79A7"}


def seq_colour(index: int) -> str:
    """The colour of the ``index``-th sequence of a picture (it cycles after seven)."""
    return OKABE_ITO[index % len(OKABE_ITO)]


def seq_style(index: int, *, dim: bool = False) -> Style:
    """Block-filling style for a sequence: its colour as background, readable text on top.

    ``dim`` is for slots reserved but not yet written: the colour as foreground only, so a
    reserved slot looks like an outline of the token slot it will become."""
    colour = seq_colour(index)
    if dim:
        return Style(color=colour)
    text = "black" if colour in _DARK_TEXT else "white"
    return Style(color=text, bgcolor=colour, bold=True)


# One glyph per memory category. A token slot shows the owning sequence's letter instead of the
# glyph (uppercase), a reserved slot its lowercase letter; the glyphs below are what a slot shows
# when the letter would say nothing (waste bars), or when the slot belongs to nobody.
CATEGORY_GLYPH = {
    "token": "█",
    "reserved": "▒",
    "internal_fragmentation": "×",
    "external_fragmentation": "!",
    "free": "·",
}
CATEGORY_STYLE = {
    "token": Style(color="#0072B2"),
    "reserved": Style(color="#56B4E9"),
    "internal_fragmentation": Style(color="#E69F00", bold=True),
    "external_fragmentation": Style(color="#D55E00", bold=True),
    "free": Style(color=GREY),
}
CATEGORY_LABEL = {
    "token": "token",
    "reserved": "reserved",
    "internal_fragmentation": "internal frag.",
    "external_fragmentation": "external frag.",
    "free": "free",
}

# Block states in the physical memory map (``viz/blocks.py``).
FREE_GLYPH = "·"  # a free block: on the allocator's free list, holds nothing anyone can find
CACHED_GLYPH = "○"  # free, but still holds a full block findable by its hash (prefix cache)
SWAPPED_GLYPH = "⇣"  # a block of the CPU pool holding a swapped-out sequence's K/V
COPY_GLYPH = "⧉"  # destination of a copy-on-write this step
FILL_GLYPH = "█"  # a slot of a block holding a token
EMPTY_GLYPH = "·"  # a slot of a block not (yet) holding a token

FREE_STYLE = Style(color=GREY)
CACHED_STYLE = Style(color="#009E73", italic=True)
COPY_STYLE = Style(color="#D55E00", bold=True)
HEADING_STYLE = Style(bold=True)
NOTE_STYLE = Style(color=GREY, italic=True)

# The step log's kinds of event: a short tag that reads without colour, and a colour.
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
    "reject": ("! reject", "#D55E00"),
    "wait": (". wait", "#E69F00"),
    "check": ("= check", "#009E73"),
    "note": ("  note", GREY),
}


def seq_label(index: int) -> str:
    """The letter of the ``index``-th sequence: A .. Z, then a .. z, then A1, B1 ..."""
    if index < 0:
        raise ValueError(f"index={index} must be >= 0")
    if index < 26:
        return chr(65 + index)
    if index < 52:
        return chr(97 + index - 26)
    return f"{chr(65 + index % 26)}{index // 26 - 1}"
