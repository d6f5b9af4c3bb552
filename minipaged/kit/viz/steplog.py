"""The step log: what happened this step, in words, one line per event.

A scene writes an ``Event`` for each thing it asked a manager to do and the answer it got
(admitted, appended to slot 21, forked, copied block 3 -> 9, evicted, preempted ...). Each kind
has a short tag that reads without colour (``+ admit``, ``= copy``), see ``palette.EVENT_TAG``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from minipaged.kit.viz.palette import EVENT_TAG, HEADING_STYLE, NOTE_STYLE


@dataclass(frozen=True)
class Event:
    kind: str  # one of palette.EVENT_TAG
    text: str

    def __post_init__(self) -> None:
        if self.kind not in EVENT_TAG:
            raise ValueError(f"event kind={self.kind!r} is not one of {sorted(EVENT_TAG)}")


def step_log(events: Sequence[Event], *, title: str = "this step",
             limit: int = 8) -> RenderableType:
    """The events, oldest first; beyond ``limit`` lines the rest are counted, not listed."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, min_width=9)
    grid.add_column()
    for e in events[:limit]:
        tag, colour = EVENT_TAG[e.kind]
        grid.add_row(Text(tag, style=f"bold {colour}"), Text(e.text))
    if len(events) > limit:
        grid.add_row(Text(""), Text(f"... and {len(events) - limit} more", NOTE_STYLE))
    if not events:
        grid.add_row(Text(""), Text("(nothing new)", NOTE_STYLE))
    return Group(Text(title, HEADING_STYLE), grid)
