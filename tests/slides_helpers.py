"""What the slide tests share: where the deck is, and its slides.

tests/test_slides.py tests the deck (its shape, Marp's rendering, the teacher's plan, the
presenter) and tests/test_slides_figures.py its figures.
"""

from __future__ import annotations

from pathlib import Path

from minipaged.kit import present

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
DECKS = sorted(SLIDES.glob("*.md"))
DECKS = [d for d in DECKS if d.name != "README.md"]


def deck_slides() -> list[present.Slide]:
    return present.parse_deck(DECKS[0].read_text(encoding="utf-8"))
