"""The slide deck and the terminal presenter.

Promises tested here:
- the deck has 30 to 50 slides, each with speaker notes;
- every file the deck references exists, with its text twin, and every SVG parses as XML;
- every ``<!-- demo: SCENE -->`` names a real demo scene;
- Marp renders the deck to HTML (and, where Chromium is installed, to 1280x720 PNGs);
- the 45-minute plan in slides/README.md covers every slide once;
- the figures written as text in the deck are the package's;
- the presenter prints every slide without waiting when stdout is not a terminal, and pages
  forward, back and through notes on key presses in a terminal.
The figures themselves (fresh, legible, true to the managers) are tested in
tests/test_slides_figures.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console
from slides_helpers import DECKS, ROOT, SLIDES, deck_slides

from minipaged.kit import present


def test_there_is_a_deck():
    assert DECKS, "slides/ holds no Marp deck"
    for deck in DECKS:
        assert deck.read_text(encoding="utf-8").startswith("---\nmarp: true")


@pytest.mark.parametrize("deck", DECKS, ids=[d.name for d in DECKS])
def test_deck_shape_and_references(deck):
    slides = present.parse_deck(deck.read_text(encoding="utf-8"))
    assert 30 <= len(slides) <= 50
    for s in slides:
        assert s.notes, f"slide {s.number} has no speaker notes"
    for s in slides:
        for img in s.images:
            path = deck.parent / img
            assert path.is_file(), f"slide {s.number} references missing {img}"
            assert path.with_suffix(".txt").is_file(), f"{img} has no text twin"
            if path.suffix == ".svg":
                ET.parse(path)                   # valid XML
    from minipaged.kit.viz.scenes import SCENES

    names = {c.name for c in SCENES}
    for s in slides:
        for scene in s.demos:
            assert scene in names, f"slide {s.number}: no demo scene {scene!r}"


# ---- Marp renders it -------------------------------------------------------------------------
def _marp() -> list[str]:
    """The marp command, or skip: a global ``marp``, else ``npx`` with marp-cli installed (never
    downloading it: CI has no npm)."""
    if shutil.which("marp"):
        return ["marp"]
    if shutil.which("npx"):
        probe = subprocess.run(["npx", "--no-install", "@marp-team/marp-cli", "--version"],
                               capture_output=True, text=True, timeout=120)
        if probe.returncode == 0:
            return ["npx", "--no-install", "@marp-team/marp-cli"]
    pytest.skip("marp-cli is not installed (npm install -g @marp-team/marp-cli; needs Node.js)")


def test_marp_renders_the_deck_to_html(tmp_path):
    out = tmp_path / "deck.html"
    run = subprocess.run([*_marp(), str(DECKS[0]), "-o", str(out)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    html = out.read_text(encoding="utf-8")
    assert html.count("<section") >= len(deck_slides())
    for s in deck_slides():
        for img in s.images:
            assert img in html, img


def _chrome() -> str | None:
    for name in (os.environ.get("CHROME_PATH", ""), "chromium", "chromium-browser",
                 "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.slow
def test_marp_renders_1280x720_pngs(tmp_path):
    """The PNGs slides/README.md tells teachers to make (Chromium renders them)."""
    marp, chrome = _marp(), _chrome()
    if chrome is None:
        pytest.skip("no Chromium to render PNGs (apt-get install chromium, or set CHROME_PATH)")
    run = subprocess.run([*marp, str(DECKS[0]), "--images", "png", "--allow-local-files",
                          "-o", str(tmp_path / "deck.png")], capture_output=True, text=True,
                         timeout=600, cwd=ROOT, env={**os.environ, "CHROME_PATH": chrome})
    assert run.returncode == 0, run.stderr[-2000:]
    pngs = sorted(tmp_path.glob("deck.*.png"))
    assert len(pngs) == len(deck_slides())
    for png in pngs:
        head = png.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == \
            (1280, 720), png.name


# ---- the teacher's plan ----------------------------------------------------------------------
def test_the_45_minute_plan_covers_every_slide_once():
    readme = (SLIDES / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+)-(\d+) \| (\d+)-(\d+) \|", readme, re.MULTILINE)
    minutes = [(int(a), int(b)) for a, b, _, _ in rows]
    slides = [(int(c), int(d)) for _, _, c, d in rows]
    n = len(deck_slides())
    assert minutes[0][0] == 0 and minutes[-1][1] == 45
    assert all(x[1] == y[0] for x, y in zip(minutes, minutes[1:]))
    assert slides[0][0] == 1 and slides[-1][1] == n
    assert all(x[1] + 1 == y[0] for x, y in zip(slides, slides[1:]))
    skip = re.search(r"skip slides (\d+)-(\d+) \((.*?)\) and point", " ".join(readme.split()))
    titles = [deck_slides()[i - 1].body.splitlines()[0].lstrip("# ")
              for i in range(int(skip.group(1)), int(skip.group(2)) + 1)]
    assert skip.group(3).split("; ") == titles


def test_parse_deck_rules():
    deck = ("---\nmarp: true\n---\n# one\n<!-- a note -->\n<!-- _class: lead -->\n---\n"
            "```\n---\n```\n<!-- demo: paging -->\n![x](figures/a.svg)\n")
    s = present.parse_deck(deck)
    assert len(s) == 2                                   # the fenced --- does not split
    assert s[0].notes == ["a note"]                      # directives are not notes
    assert s[1].demos == ["paging"] and s[1].images == ["figures/a.svg"]
    with pytest.raises(ValueError, match="never closed"):
        present.parse_deck("---\nmarp: true\n# no end\n")


def test_presenter_prints_every_slide_without_a_terminal():
    deck = DECKS[0]
    console = Console(record=True, width=100, color_system=None)
    assert present.present(deck, notes=True, start=1, interactive=False, console=console) == 0
    out = console.export_text()
    n = len(present.parse_deck(deck.read_text(encoding="utf-8")))
    assert f"{n}/{n}" in out and "speaker notes" in out
    with pytest.raises(ValueError, match="outside"):
        present.present(deck, notes=False, start=n + 1, interactive=False, console=console)


def test_presenter_keys(monkeypatch):
    keys = iter(["n", " ", " ", "b", "q"])
    monkeypatch.setattr(present, "wait_key", lambda prompt: next(keys))
    console = Console(record=True, width=100, color_system=None)
    assert present.present(DECKS[0], notes=False, start=1, interactive=True,
                           console=console) == 0
    out = console.export_text()
    assert "speaker notes" in out          # n turned the notes on
    assert " 3/" in out and "2/" in out    # forward twice, then back


def test_presenter_arrow_keys(monkeypatch):
    # The arrow keys as keys.decode_key names them: right twice, left once, right: slide 3.
    keys = iter(["right", "right", "left", "right", "q"])
    shown = []
    monkeypatch.setattr(present, "wait_key", lambda prompt: next(keys))
    monkeypatch.setattr(present, "render_slide",
                        lambda s, total, base, notes: shown.append(s.number) or "")
    console = Console(record=True, width=100, color_system=None)
    assert present.present(DECKS[0], notes=False, start=1, interactive=True,
                           console=console) == 0
    assert shown == [1, 2, 3, 2, 3]


def test_present_cli():
    env = dict(os.environ, COLUMNS="100", TERM="dumb")
    run = subprocess.run([sys.executable, "-m", "minipaged", "present",
                          str(DECKS[0].relative_to(ROOT)), "--slide", "36"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env=env,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Exercises" in run.stdout
    missing = subprocess.run([sys.executable, "-m", "minipaged", "present", "nope.md"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert missing.returncode == 2 and "minipaged present: deck='nope.md' does not exist" in \
        missing.stderr


def test_numbers_typed_into_the_deck_are_the_packages():
    """The few figures written as text (worked arithmetic, not tables) must equal what the
    package computes; tables of figures are generated (kv_fits, seed_wrong) instead."""
    from minipaged.sim.memory import PRESETS, GiB, block_table_bytes, kv_calc

    text = DECKS[0].read_text(encoding="utf-8")
    opt = kv_calc(PRESETS["opt-13b"])
    assert f"= {opt['kv_bytes_per_token'] // 1024} KiB per token" in text
    assert f"about {opt['token_slots'] / 1000:.1f}K tokens" in text
    t128 = block_table_bytes(128 * 1024, 16)
    assert f"= {t128 // 4} int32 entries = **{t128 // 1024} KiB** per request" in text
    assert f"**{block_table_bytes(32 * 1024, 16) * 1000 / 2**20:.1f} MiB**" in text
    llama = kv_calc(PRESETS["llama-3-8b"], context_len=128 * 1024)
    assert f"{llama['kv_bytes_per_request'] / GiB:.0f} GiB of KV for one 128K-token" in text
    n = len(present.parse_deck(text))
    assert f"is a {n}-slide deck" in (SLIDES / "README.md").read_text(encoding="utf-8")
