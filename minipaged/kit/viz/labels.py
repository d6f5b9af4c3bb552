"""Which letter and colour each sequence gets in a picture.

A picture names sequences by letter (A, B, C ...), never by colour alone. ``Labels`` hands out
letters in order of first appearance and remembers them, so a sequence keeps its letter and
colour from frame to frame of a scene, and the same seed always gives the same letters.
"""

from __future__ import annotations

from collections.abc import Hashable

from rich.style import Style

from minipaged.kit.viz.palette import seq_label, seq_style


class Labels:
    """seq_id -> (letter, colour index), assigned on first sight, stable afterwards."""

    def __init__(self, names: dict[Hashable, str] | None = None) -> None:
        self._index: dict[Hashable, int] = {}
        self._names: dict[Hashable, str] = {}
        for seq_id, name in (names or {}).items():
            self.name(seq_id, name)

    def name(self, seq_id: Hashable, name: str) -> None:
        """Give ``seq_id`` an explicit label (a scene may call a beam "B2", say)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name={name!r} for seq_id={seq_id!r} must be a non-empty string")
        self.index(seq_id)
        self._names[seq_id] = name

    def index(self, seq_id: Hashable) -> int:
        if seq_id not in self._index:
            self._index[seq_id] = len(self._index)
        return self._index[seq_id]

    def __call__(self, seq_id: Hashable) -> str:
        """The sequence's label: its explicit name, else its letter."""
        i = self.index(seq_id)
        return self._names.get(seq_id, seq_label(i))

    def letter(self, seq_id: Hashable) -> str:
        """One character for slot strips: the first character of the label."""
        return self(seq_id)[0]

    def style(self, seq_id: Hashable, *, dim: bool = False) -> Style:
        return seq_style(self.index(seq_id), dim=dim)
