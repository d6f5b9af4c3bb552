"""``minipaged demo``: snapshots, determinism, headless play-through, SVG/HTML recording, errors.

Snapshots: each scene's text (no colour) at width 100 and seed 0 is compared with
tests/snapshots/<scene>.txt. A changed picture fails the test; after reviewing the new picture,
accept it with ``MINIPAGED_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_demo.py``. A missing
snapshot fails too (it is never created silently outside that flag).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from minipaged.kit.cli import main
from minipaged.kit.demo import tour
from minipaged.kit.viz.scenes import SCENES

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
UPDATE = os.environ.get("MINIPAGED_UPDATE_SNAPSHOTS") == "1"
READY = [cls for cls in SCENES if cls.missing() is None]


def scene_text(cls, *, seed: int = 0, width: int = 100) -> str:
    scene = cls(seed=seed, width=width)
    frames = list(scene.frames())
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    for i, f in enumerate(frames):
        console.print(f.renderable(index=i, total=len(frames), title=scene.title))
    return console.export_text()


def test_every_scene_that_can_play_is_ready():
    # fragmentation and paging need only the core; they must never drop out of the tour.
    assert {"fragmentation", "paging"} <= {cls.name for cls in READY}


@pytest.mark.parametrize("cls", READY, ids=[c.name for c in READY])
def test_scene_matches_its_snapshot(cls):
    text = scene_text(cls)
    too_wide = [line for line in text.splitlines() if len(line.rstrip()) > 100]
    assert not too_wide, too_wide[:3]
    path = SNAPSHOTS / f"{cls.name}.txt"
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
    if not path.exists():
        # Every scene in the tour must have a reviewed picture: a missing one is a failure,
        # never a silent pass (nor a skip that CI would count as fine).
        pytest.fail(f"no snapshot {path.name}: review `minipaged demo {cls.name} --width "
                    f"100`, then create it with MINIPAGED_UPDATE_SNAPSHOTS=1")
    assert text == path.read_text(), (f"scene {cls.name} changed; review it "
                                      f"(minipaged demo {cls.name} --width 100) and accept "
                                      f"with MINIPAGED_UPDATE_SNAPSHOTS=1")


@pytest.mark.parametrize("cls", READY, ids=[c.name for c in READY])
def test_scene_degrades_cleanly_at_80_columns(cls):
    lines = scene_text(cls, width=80, seed=2).splitlines()
    too_wide = [line for line in lines if len(line.rstrip()) > 80]
    assert not too_wide, too_wide[:3]


def story(cls, seed: int) -> list[str]:
    """Captions and step logs of every frame (what the seed decides), without drawing."""
    return [f.caption + "|" + ";".join(e.text for e in f.events)
            for f in cls(seed=seed, width=100).frames()]


@pytest.mark.parametrize("cls", READY, ids=[c.name for c in READY])
def test_same_seed_same_story_other_seed_other_story(cls):
    # (Same seed, same *pictures* across processes is what the snapshot test checks.)
    assert story(cls, 3) == story(cls, 3)
    assert story(cls, 3) != story(cls, 4)


def test_headless_tour_exits_0_and_writes_valid_svg(tmp_path):
    # A real subprocess with stdout a pipe: it must not wait for keys (the timeout would fire).
    out = subprocess.run([sys.executable, "-m", "minipaged", "demo", "--width", "100",
                          "--svg", str(tmp_path)],
                         capture_output=True, text=True, timeout=240,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "frame 1/" in out.stdout
    files = sorted(tmp_path.glob("*.svg"))
    expected = 1 + sum(len(list(cls(seed=0, width=100).frames())) for cls in READY)
    assert len(files) == expected
    for f in files:
        assert ET.parse(f).getroot().tag.endswith("svg")


def test_html_recording_one_file_per_frame(tmp_path, capsys):
    assert main(["demo", "paging", "--width", "80", "--html", str(tmp_path)]) == 0
    files = sorted(tmp_path.glob("*.html"))
    n = len(list(READY[[c.name for c in READY].index("paging")](seed=0, width=80).frames()))
    assert len(files) == n
    assert all("<html" in f.read_text().lower() for f in files)
    capsys.readouterr()


def test_list_and_bad_arguments(capsys):
    assert main(["demo", "--list"]) == 0
    listing = capsys.readouterr().out
    assert all(cls.name in listing for cls in SCENES)
    # On the command line a bad argument is one line on stderr and exit 2, never a traceback.
    for argv, words in ((["nope"], "scene='nope' is not a scene"),
                        (["--width", "20"], "--width=20 must be >= 60 and <= 500"),
                        (["--speed", "0"], "--speed=0.0 must be > 0"),
                        (["--seed", "-1"], "--seed=-1 must be >= 0")):
        assert main(["demo", *argv]) == 2, argv
        err = " ".join(capsys.readouterr().err.split())
        assert "minipaged demo:" in err and words in err, (argv, err)
    with pytest.raises(ValueError, match="seed=-1"):
        tour(-1, 100)
    with pytest.raises(ValueError, match="width=59 is out of range: expected >= 60"):
        tour(0, 59)
    with pytest.raises(TypeError, match="seed=True must be an integer, not a bool"):
        tour(True, 100)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses a Linux pseudo-terminal")
def test_interactive_keys_in_a_terminal():
    """In a terminal the demo waits for keys: space and the right arrow step, q quits (exit 0)."""
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: the demo, with a terminal on stdin and stdout
        os.execvp(sys.executable, [sys.executable, "-m", "minipaged", "demo", "paging",
                                   "--width", "90"])
    seen = b""

    def read_until(marker: bytes, limit: float = 60.0) -> None:
        nonlocal seen
        end = time.monotonic() + limit  # a guard against hanging, not a speed requirement
        while marker not in seen and time.monotonic() < end:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    seen += os.read(fd, 65536)
                except OSError:
                    return

    read_until(b"frame 1/")
    os.write(fd, b" ")
    read_until(b"frame 2/")
    os.write(fd, b"\x1b[C")
    read_until(b"frame 3/")
    os.write(fd, b"q")
    read_until(b"\x00", limit=5.0)  # drain until the child exits
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert b"frame 3/" in seen and b"frame 4/" not in seen
