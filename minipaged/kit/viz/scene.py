"""Scenes, frames and the step log: how the demo is put together.

A ``Scene`` drives real managers (``KVCacheManager``, ``ContiguousKVCache`` ...) step by step and
yields a ``Frame`` after each step. A frame carries the picture (drawn from views read out of the
managers at that moment, ``state.py``), the step log (one ``Event`` per thing the scene asked a
manager to do, with the answer it got), and the views themselves, so a test can pause at any
frame and check the picture against the live managers (``tests/test_demo_consistency.py``).
The player (``kit/demo.py``) shows frames, waits for keys and records them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from minipaged._checks import check_choice, check_int
from minipaged.kit.viz.blocks import block_tables, memory_map
from minipaged.kit.viz.state import PoolView, read_pool
from minipaged.kit.viz.style import EVENT_TAG, HEADING_STYLE, NOTE_STYLE, Labels


@dataclass(frozen=True)
class Event:
    kind: str  # one of style.EVENT_TAG
    text: str

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, EVENT_TAG)


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


@dataclass
class Frame:
    """One picture of a scene. ``views`` holds every view drawn in it, by manager name."""

    scene: str
    caption: str  # what a teacher could read aloud; every number in it is read from a manager
    body: RenderableType
    events: list[Event] = field(default_factory=list)
    views: dict[str, object] = field(default_factory=dict)
    log_title: str = "this step"

    def renderable(self, *, index: int | None = None, total: int | None = None,
                   title: str = "") -> RenderableType:
        """The whole picture: a title rule with the frame counter, caption, body, step log."""
        step = "" if index is None else f"  ·  frame {index + 1}" + (f"/{total}" if total else "")
        head = Rule(Text.assemble((title or self.scene, HEADING_STYLE), step), align="left")
        return Group(head, Text(self.caption), Text(""), self.body, Text(""),
                     step_log(self.events, title=self.log_title))


class Scene:
    """Base class: subclasses set ``name``, ``title``, ``summary`` and write ``frames``. Most
    scenes drive one ``KVCacheManager``, ``self.manager``, drawn with ``pool_frame``."""

    name = title = summary = ""
    log_title = "this step"
    vocab: Sequence[str] | None = None  # token id -> text: tokens printed under the tables
    joiner = " "  # between two tokens' texts ("" for characters)

    def __init__(self, *, seed: int = 0, width: int = 100) -> None:
        self.seed = check_int("seed", seed, low=0)
        self.width = check_int("width", width, low=60)  # columns
        self.labels = Labels()

    @classmethod
    def missing(cls) -> str | None:
        """Why this scene cannot run here (an optional dependency is absent), or None."""
        return None

    def frames(self) -> Iterator[Frame]:
        raise NotImplementedError

    def managers(self) -> dict[str, object]:
        """The live managers, under the names of the views drawn from them in each frame."""
        return {"pool": self.manager}

    def frame(self, caption: str, body: RenderableType, events: Sequence[Event],
              **views: object) -> Frame:
        return Frame(self.name, caption, body, list(events), dict(views), self.log_title)

    def pool_frame(self, caption: str, events: Sequence[Event], *extra: RenderableType | str,
                   view: PoolView | None = None, final_lens=None,
                   highlight: Sequence[int] = (), copies=()) -> Frame:
        """Block tables over the memory map of ``self.manager`` (or of ``view``), then ``extra``
        (a string is a note); with more than one sequence, how many blocks sharing saves."""
        view = read_pool(self.manager, copies=copies) if view is None else view
        parts = [block_tables(view, self.labels, vocab=self.vocab, width=self.width,
                              final_lens=final_lens, joiner=self.joiner), Text(""),
                 memory_map(view, self.labels, width=self.width, highlight=highlight)]
        if len(view.tables) > 1 and (saving := sharing_saving(view)):
            parts += [Text(""), Text(saving, NOTE_STYLE)]
        for e in extra:
            parts += [Text(""), Text(e, NOTE_STYLE) if isinstance(e, str) else e]
        return self.frame(caption, Group(*parts), events, pool=view)


def sharing_saving(view: PoolView) -> str:
    """"n sequences hold d distinct blocks; without sharing ...", or "" when nothing is shared."""
    distinct = len({b for t in view.tables for b in t.blocks})
    alone = sum(len(t.blocks) for t in view.tables)
    if distinct == alone:
        return ""
    return (f"{len(view.tables)} sequences hold {distinct} distinct blocks; without sharing they "
            f"would hold {alone}: {100 * (alone - distinct) / alone:.0f}% saved")
