"""The demo's scenes, in tour order, and the tour's opening frame.

Each scene is a module of this package (one idea each); ``SCENES`` is the order ``minipaged demo``
plays them in. A scene that needs an optional dependency this machine lacks (``model`` needs
torch) is skipped, with the reason shown on the opening frame (``Scene.missing``).
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from minipaged.kit.viz.scene import Scene
from minipaged.kit.viz.scenes.attention import AttentionScene
from minipaged.kit.viz.scenes.cow_prefix import CowPrefixScene
from minipaged.kit.viz.scenes.fragmentation import FragmentationScene
from minipaged.kit.viz.scenes.model import ModelScene
from minipaged.kit.viz.scenes.paging import PagingScene
from minipaged.kit.viz.scenes.preempt import PreemptScene
from minipaged.kit.viz.scenes.prefix import PrefixScene
from minipaged.kit.viz.scenes.sharing import BeamScene, ForkScene
from minipaged.kit.viz.style import HEADING_STYLE, NOTE_STYLE

SCENES: tuple[type[Scene], ...] = (FragmentationScene, PagingScene, ForkScene, BeamScene,
                                   PrefixScene, CowPrefixScene, PreemptScene, AttentionScene,
                                   ModelScene)


def intro_frame(scenes: list[Scene], skipped: list[tuple[str, str]]) -> RenderableType:
    """The tour's first picture: what is coming, and what this machine cannot show."""
    table = Table(box=None, padding=(0, 2), show_header=False)
    table.add_column(no_wrap=True)
    table.add_column()
    for i, s in enumerate(scenes, 1):
        table.add_row(Text(f"{i}. {s.name}", HEADING_STYLE), s.summary)
    parts: list[RenderableType] = [
        Rule(Text("minipaged demo: a paged KV cache at work", HEADING_STYLE), align="left"),
        Text("Every picture is drawn from the real cache managers of this package as the scene "
             "drives them. Letters name sequences; every colour also has a letter or a glyph."),
        Text(""), table]
    if skipped:
        parts += [Text(""), Text("not in this tour (what they need is missing here):",
                                 NOTE_STYLE)]
        parts += [Text(f"  {name}: {why}", NOTE_STYLE) for name, why in skipped]
    return Group(*parts)
