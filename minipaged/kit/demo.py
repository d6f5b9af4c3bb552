"""``minipaged demo [SCENE]``: the classroom demo, live pictures of a paged KV cache at work.

Every picture is drawn from the real managers of this package (``KVCacheManager``,
``ContiguousKVCache`` ...) as the scene drives them; nothing is scripted. The scenes live in
``kit/viz/scenes/``, the pictures in ``kit/viz/``. This module is the player:

* in a terminal: space or right arrow steps, ``a`` toggles autoplay (``--speed`` seconds a frame),
  ``q`` quits;
* when stdout is not a terminal (a pipe, CI, a recording) it plays every frame through without
  waiting for keys and exits 0;
* ``--svg DIR`` / ``--html DIR`` also write one file per frame (rich's recording console);
  ``--seed`` makes the run repeatable, ``--width`` forces the layout.
"""

from __future__ import annotations

import io
import itertools
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

from rich.console import Console, RenderableType

from minipaged.kit.keys import key_reader


def layout_width(console: Console, forced: int | None) -> int:
    """The width pictures are laid out for: forced (--width, 60 to 500 columns, as the command
    line checked), else the terminal's, between 60 and 100."""
    return forced if forced is not None else max(60, min(100, console.width))


def tour(seed: int, width: int, only: str | None = None):
    """The scenes to play (instances), and the skipped ones as (name, reason) pairs."""
    from minipaged.kit.viz.scenes import SCENES

    names = [s.name for s in SCENES]
    if only is not None and only not in names:
        raise ValueError(f"scene={only!r} is not a scene; expected one of {names}")
    playing, skipped = [], []
    for cls in SCENES:
        if only in (None, cls.name):
            why = cls.missing()
            if why is None:
                playing.append(cls(seed=seed, width=width))
            else:
                skipped.append((cls.name, why))
    return playing, skipped


def all_frames(scenes) -> Iterator[tuple[str, int, int, RenderableType]]:
    """(scene name, step, steps in scene, renderable) for every frame of every scene."""
    for scene in scenes:
        frames = list(scene.frames())
        for i, f in enumerate(frames):
            yield scene.name, i, len(frames), f.renderable(index=i, total=len(frames),
                                                          title=scene.title)


def record(renderable: RenderableType, width: int, path: Path, title: str) -> None:
    """Write one frame as SVG or HTML (by ``path``'s suffix) with rich's recording console."""
    rec = Console(record=True, width=width, file=io.StringIO(), force_terminal=True,
                  color_system="truecolor", legacy_windows=False)
    rec.print(renderable)
    if path.suffix == ".svg":
        rec.save_svg(str(path), title=title)
    else:
        rec.save_html(str(path))


def run(args) -> int:
    """Play the scenes ``args`` (``minipaged demo``'s parsed arguments) ask for. The command
    line has checked --seed, --width, --speed and the --svg / --html folders; a ValueError
    here (a bad scene) is its one-line error and exit 2."""
    from minipaged.kit.viz.scenes import SCENES, intro_frame

    console = Console()
    width = layout_width(console, args.width)
    scenes, skipped = tour(args.seed, width, args.scene)
    if args.list:
        for cls in SCENES:
            why = cls.missing()
            console.print(f"{cls.name:<14} {'ready' if why is None else 'skipped: ' + why}",
                          markup=False)  # a hint's ".[torch]" is not rich markup
        return 0
    if args.scene is not None and not scenes:
        console.print(f"scene {args.scene!r} cannot play here: {skipped[0][1]}", markup=False)
        return 1
    console = Console(width=width)
    outputs = [(Path(d), ext) for d, ext in ((args.svg, ".svg"), (args.html, ".html")) if d]
    for d, ext in outputs:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:   # OSError names the folder; the command line names its flag
            raise ValueError(f"--{ext[1:]}={str(d)!r} cannot be created: {e.strerror or e}"
                             ) from None
    frames: Iterator[tuple[str, int, int, RenderableType]] = all_frames(scenes)
    if args.scene is None:
        frames = itertools.chain([("tour", 0, 0, intro_frame(scenes, skipped))], frames)
    interactive = sys.stdout.isatty() and sys.stdin.isatty()
    autoplay = args.autoplay
    with key_reader() if interactive else nullcontext() as read_key:
        for index, (name, step, _total, renderable) in enumerate(frames):
            for d, ext in outputs:
                record(renderable, width, d / f"{index:03d}_{name}_{step + 1:02d}{ext}",
                       f"minipaged demo {name}")
            if not interactive:
                console.print(renderable)
                console.print()
                continue
            console.clear()
            console.print(renderable)
            mode = "autoplay (a: pause)" if autoplay else "space/→: next   a: autoplay"
            console.print(f"[dim]{mode}   q: quit[/dim]")
            key = read_key(args.speed if autoplay else None)  # None: autoplay's time is up
            if key == "q":  # any other key (space, enter, the right arrow) steps
                break
            if key == "a":
                autoplay = not autoplay
    return 0

