"""A terminal presenter for the Marp deck: ``minipaged present slides/NAME.md``.

What it teaches: nothing new; it lets a teacher present the course in a classroom without a
browser, from the very Markdown that Marp renders to HTML and PDF. It pages through the slides
(``---`` separators, Marp's front matter skipped), shows each image as the plain-text twin of
its SVG (``slides/figures/NAME.txt``, written by ``figures.py``), shows speaker notes (HTML
comments) and plays a live demo scene where a slide says ``<!-- demo: SCENE -->``. The keys and
options are in ``minipaged present --help``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from minipaged.kit.keys import wait_key

COMMENT = re.compile(r"<!--(.*?)-->", re.DOTALL)
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)[^)]*\)")
DEMO = re.compile(r"^\s*demo:\s*([a-z_-]+)\s*$")
# Marp directives written as comments; they are not speaker notes.
DIRECTIVE = re.compile(r"^\s*_?(class|paginate|header|footer|backgroundColor|color|theme|"
                       r"size|style|marp|headingDivider)\s*:", re.IGNORECASE)


@dataclass
class Slide:
    number: int
    body: str                                   # Markdown without comments
    notes: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    demos: list[str] = field(default_factory=list)
    directives: dict[str, str] = field(default_factory=dict)   # Marp's, e.g. {"_class": "fig"}


def parse_deck(text: str) -> list[Slide]:
    """Split a Marp deck into slides: front matter dropped, comments sorted into speaker notes,
    directives and ``demo:`` markers."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":                    # front matter
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is None:
            raise ValueError("the deck's front matter (starting with ---) is never closed")
        lines = lines[end + 1:]
    chunks, cur, fence = [], [], False
    for line in lines:
        if line.strip().startswith("```"):
            fence = not fence
        if line.strip() == "---" and not fence:
            chunks.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    chunks.append("\n".join(cur))
    slides = []
    for chunk in chunks:
        if not chunk.strip():
            continue
        notes, demos, directives = [], [], {}
        for c in COMMENT.findall(chunk):
            m = DEMO.match(c)
            if m:
                demos.append(m.group(1))
            elif DIRECTIVE.match(c):
                key, _, value = c.strip().partition(":")
                directives[key.strip()] = value.strip()
            else:
                notes.append(c.strip())
        body = COMMENT.sub("", chunk).strip()
        slides.append(Slide(len(slides) + 1, body, notes, IMAGE.findall(body), demos,
                            directives))
    return slides


def check_demos(slides: list[Slide], path) -> None:
    """Every ``<!-- demo: SCENE -->`` must name a demo scene. Checked when the deck loads: found
    only when d is pressed, a bad name would end the presentation in front of the class."""
    from minipaged.kit.viz.scenes import SCENES

    names = [cls.name for cls in SCENES]
    for s in slides:
        for scene in s.demos:
            if scene not in names:
                raise ValueError(f"{path}: slide {s.number}'s <!-- demo: {scene} --> names no "
                                 f"demo scene; expected one of {', '.join(names)}")


def render_slide(slide: Slide, total: int, deck_dir: Path, *, notes: bool):
    from rich.console import Group
    from rich.markdown import Markdown
    from rich.panel import Panel
    from rich.text import Text

    parts: list = [Markdown(IMAGE.sub(lambda m: f"*[figure: {m.group(1)}]*", slide.body))]
    for img in slide.images:
        twin = (deck_dir / img).with_suffix(".txt")
        if twin.is_file():
            parts.append(Text(twin.read_text(encoding="utf-8").rstrip(), no_wrap=True,
                              overflow="crop"))
        else:
            parts.append(Text(f"(figure {img} has no text twin; run minipaged present "
                              f"--build-figures)", style="yellow"))
    for scene in slide.demos:
        parts.append(Text(f"live demo: minipaged demo {scene}  (press d to play it here)",
                          style="bold cyan"))
    if notes and slide.notes:
        parts.append(Panel(Text("\n\n".join(slide.notes)), title="speaker notes",
                           border_style="dim"))
    return Panel(Group(*parts), title=f"{slide.number}/{total}", title_align="right")


def play_demo(scene: str, console, *, interactive: bool) -> None:
    """Play one demo scene inline (every frame printed; in a terminal a key per frame)."""
    from minipaged.kit.demo import all_frames, tour

    scenes, skipped = tour(0, min(console.width, 100), scene)
    if not scenes:
        console.print(f"demo scene {scene!r} cannot play here: {skipped[0][1]}")
        return
    for _name, _step, _total, renderable in all_frames(scenes):
        console.print(renderable)
        if interactive and wait_key("frame: any key, q ends the demo ") == "q":
            return


def present(path: Path, *, notes: bool, start: int, interactive: bool, console=None) -> int:
    from rich.console import Console

    console = console or Console()
    slides = parse_deck(path.read_text(encoding="utf-8"))
    if not slides:
        raise ValueError(f"{path} holds no slides")
    check_demos(slides, path)
    if not 1 <= start <= len(slides):
        raise ValueError(f"--slide {start} is outside 1..{len(slides)}")
    if not interactive:
        for s in slides[start - 1:]:
            console.print(render_slide(s, len(slides), path.parent, notes=notes))
        return 0
    i = start - 1
    while True:
        console.clear()
        console.print(render_slide(slides[i], len(slides), path.parent, notes=notes))
        k = wait_key("space/→ next  b/← back  n notes  d demo  q quit ")
        if k == "q":
            return 0
        if k == "n":
            notes = not notes
        elif k == "d" and slides[i].demos:
            for scene in slides[i].demos:
                play_demo(scene, console, interactive=True)
        elif k in ("b", "left", "h"):
            i = max(0, i - 1)
        else:
            i = min(len(slides) - 1, i + 1)
