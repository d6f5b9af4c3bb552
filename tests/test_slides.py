"""The slide deck, its figures and the terminal presenter.

Promises tested here:
- the deck has 30 to 50 slides, each with speaker notes;
- every file the deck references exists, with its text twin, and every SVG parses as XML;
- no committed figure is stale: a fresh rendering from the demo and the simulator matches the
  committed text twin and the manifest's hash (rebuild: ``minipaged present --build-figures``);
- every ``<!-- demo: SCENE -->`` names a real demo scene;
- the presenter prints every slide without waiting when stdout is not a terminal, and pages
  forward, back and through notes on key presses in a terminal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from minipaged.kit import figures, present

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
FIGURES = SLIDES / "figures"
DECKS = sorted(SLIDES.glob("*.md"))
DECKS = [d for d in DECKS if d.name != "README.md"]


@pytest.fixture(scope="module")
def fresh() -> dict[str, str]:
    return figures.render_texts()


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


def test_every_figure_is_used_and_comes_from_a_spec():
    used = set()
    for deck in DECKS:
        for s in present.parse_deck(deck.read_text(encoding="utf-8")):
            used |= {Path(i).stem for i in s.images}
    specs = {f.name for f in figures.figure_specs()}
    assert used <= specs, f"figures not produced by the generator: {used - specs}"
    assert specs <= used, f"figures generated but unused: {specs - used}"


def test_committed_figures_are_not_stale(fresh):
    bad = list(figures.stale(FIGURES, fresh))
    assert not bad, (f"stale or missing figures {bad}: run `minipaged present "
                     f"--build-figures`, review the pictures, commit them")


def test_staleness_is_detected(tmp_path, fresh):
    copy = tmp_path / "figures"
    shutil.copytree(FIGURES, copy)
    assert list(figures.stale(copy, fresh)) == []
    name = next(iter(fresh))
    (copy / f"{name}.txt").write_text("an old picture\n")
    assert list(figures.stale(copy, fresh)) == [name]
    (copy / f"{name}.txt").unlink()
    other = list(fresh)[1]
    (copy / f"{other}.svg").unlink()
    assert set(figures.stale(copy, fresh)) == {name, other}


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
    monkeypatch.setattr(present, "_key", lambda prompt: next(keys))
    console = Console(record=True, width=100, color_system=None)
    assert present.present(DECKS[0], notes=False, start=1, interactive=True,
                           console=console) == 0
    out = console.export_text()
    assert "speaker notes" in out          # n turned the notes on
    assert " 3/" in out and "2/" in out    # forward twice, then back


def test_presenter_arrow_keys(monkeypatch):
    # The arrow keys as quiz.decode_key names them: right twice, left once, right: slide 3.
    keys = iter(["right", "right", "left", "right", "q"])
    shown = []
    monkeypatch.setattr(present, "_key", lambda prompt: next(keys))
    monkeypatch.setattr(present, "render_slide",
                        lambda s, total, base, notes: shown.append(s.number) or "")
    console = Console(record=True, width=100, color_system=None)
    assert present.present(DECKS[0], notes=False, start=1, interactive=True,
                           console=console) == 0
    assert shown == [1, 2, 3, 2, 3]


def test_present_cli():
    env = dict(os.environ, COLUMNS="100", TERM="dumb")
    run = subprocess.run([sys.executable, "-m", "minipaged", "present",
                          str(DECKS[0].relative_to(ROOT)), "--slide", "37"], cwd=ROOT,
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
