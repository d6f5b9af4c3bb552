"""The slide deck's figures: generated, never stale, legible from the back of the room.

Promises tested here:
- every figure the deck shows comes from a spec of the generator, and every spec is shown;
- no committed figure is stale: a fresh drawing from the managers, the simulator and the
  fact-check equals the committed SVG and text twin byte for byte, and the manifest's hashes
  (rebuild: ``minipaged present --build-figures``); a stale one is detected;
- the figures are legible at 1280x720 from the back of a room: drawn diagrams, not terminal
  captures, shown at the size they are drawn, no text below 16 px on the slide, only glyphs that
  DejaVu Sans and Liberation Sans both have;
- the block-table diagram shows exactly what the manager holds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from slides_helpers import DECKS, SLIDES, deck_slides

from minipaged.kit import diagrams, figures, present

FIGURES = SLIDES / "figures"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def fresh() -> dict[str, diagrams.Drawing]:
    return figures.render_all()


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
    names = list(fresh)
    (copy / f"{names[0]}.txt").write_text("an old picture\n")
    svg = copy / f"{names[1]}.svg"
    svg.write_text(svg.read_text().replace("#0", "#9", 1))     # one changed label
    (copy / f"{names[2]}.svg").unlink()
    assert set(figures.stale(copy, fresh)) == set(names[:3])
    figures.build(copy)
    assert list(figures.stale(copy, fresh)) == []


def test_build_removes_figures_no_spec_makes(tmp_path):
    out = tmp_path / "figures"
    out.mkdir()
    (out / "old_capture.svg").write_text("<svg/>")
    (out / "old_capture.txt").write_text("old")
    (out / "manifest.json").write_text('{"old_capture": {}}')    # an earlier build made it
    (out / "notes.txt").write_text("mine")      # a file no build made is the user's: it stays
    made = figures.build(out)
    assert not (out / "old_capture.svg").exists() and not (out / "old_capture.txt").exists()
    assert (out / "notes.txt").read_text() == "mine"
    assert set(made) == {f.name for f in figures.figure_specs()}


# ---- legible from the back of the room ------------------------------------------------------
STYLE_PADDING = re.compile(r"section\.fig \{ padding: (\d+)px (\d+)px (\d+)px (\d+)px;")
HEADING_PX = 36 * 1.25 + 6      # section.fig h2: 36 px at line height 1.25, 6 px below it
MIN_SLIDE_FONT = 16


def _svg_size(path: Path) -> tuple[float, float]:
    vb = ET.parse(path).getroot().get("viewBox").split()
    return float(vb[2]), float(vb[3])


def test_figures_are_drawn_at_the_size_they_are_shown():
    """Each figure is a diagram (no terminal capture), on a ``fig`` slide, shown at its drawn
    width, and fits below the heading without being shrunk: so every font renders at its size."""
    text = DECKS[0].read_text(encoding="utf-8")
    top, right, bottom, left = map(int, STYLE_PADDING.search(text).groups())
    seen = 0
    for s in deck_slides():
        for m in re.finditer(r"!\[([^\]]*)\]\(([^)\s]+)\)", s.body):
            path = DECKS[0].parent / m.group(2)
            root = ET.parse(path).getroot()
            assert "rich-terminal" not in (root.get("class") or ""), f"{path.name}: a capture"
            w, h = _svg_size(path)
            shown = int(re.fullmatch(r"w:(\d+)", m.group(1)).group(1))
            assert s.directives.get("_class") == "fig", f"slide {s.number}: not a fig slide"
            assert shown == w <= 1280 - left - right, (path.name, shown, w)
            assert h <= diagrams.MAX_HEIGHT <= 720 - top - bottom - HEADING_PX, (path.name, h)
            seen += 1
    assert seen == len(figures.figure_specs())


def _texts(path: Path) -> list[ET.Element]:
    return list(ET.parse(path).getroot().iter(f"{SVG}text"))


def test_no_text_renders_below_16_px():
    for svg in sorted(FIGURES.glob("*.svg")):
        sizes = [float(t.get("font-size")) for t in _texts(svg)]
        assert sizes and min(sizes) >= max(diagrams.MIN_FONT, MIN_SLIDE_FONT), svg.name


def _rare_glyphs() -> set[str]:
    chars = set()
    for svg in FIGURES.glob("*.svg"):
        chars |= {c for t in _texts(svg) for c in (t.text or "")}
    for s in deck_slides():                   # what is projected: bodies, not speaker notes
        chars |= set(s.body)
    return {c for c in chars if not " " <= c <= "~" and c != "\n"}


def test_every_glyph_is_one_every_common_font_has():
    rare = _rare_glyphs()
    assert rare <= diagrams.GLYPHS, f"glyphs outside GLYPHS: {sorted(rare - diagrams.GLYPHS)}"
    for svg in FIGURES.glob("*.svg"):       # and the figures ask for those fonts
        assert ET.parse(svg).getroot().get("font-family").startswith("DejaVu Sans, Liberation")


def test_the_fonts_have_those_glyphs():
    """Where fontconfig is installed, ask it which fonts cover each glyph of ``GLYPHS``."""
    if shutil.which("fc-list") is None:
        pytest.skip("fc-list (fontconfig) is not installed: cannot ask which fonts hold a glyph")
    families = subprocess.run(["fc-list", ":", "family"], capture_output=True, text=True,
                              timeout=60).stdout
    fonts = [f for f in ("DejaVu Sans", "Liberation Sans") if f in families.splitlines()]
    if not fonts:
        pytest.skip("neither DejaVu Sans nor Liberation Sans is installed here")
    for ch in sorted(diagrams.GLYPHS | {"A", "#"}):
        out = subprocess.run(["fc-list", f":charset={ord(ch):x}", "family"],
                             capture_output=True, text=True, timeout=60).stdout.splitlines()
        for font in fonts:
            assert font in out, f"{font} has no glyph for {ch!r} (U+{ord(ch):04X})"
    no_box = subprocess.run(["fc-list", ":charset=29c9", "family"], capture_output=True,
                            text=True, timeout=60).stdout.splitlines()
    assert not set(fonts) & set(no_box), "the check would pass a glyph these fonts lack"


def test_drawing_refuses_what_the_back_row_cannot_read():
    c = diagrams.Canvas()
    with pytest.raises(ValueError, match="font size 14"):
        c.text(0, 20, "tiny", 14)
    with pytest.raises(ValueError, match="outside the glyphs"):
        c.text(0, 20, "copied ⧉", 24)             # the old copy-on-write mark: a box
    with pytest.raises(ValueError, match="runs off"):
        c.text(0, 20, "x" * 200, 24)
    c.rect(0, 0, 10, diagrams.MAX_HEIGHT + 10)
    with pytest.raises(ValueError, match="would be shrunk"):
        c.svg("too tall")


def test_the_block_table_diagram_shows_what_the_manager_holds():
    from minipaged import KVCacheManager
    from minipaged.kit.pool_diagram import Marks, draw, read_state

    m = KVCacheManager(6, 4)
    m.allocate("A", list(range(6)))
    m.fork("A", "B")
    m.append_slot("A", 9)                          # A copies the shared partial block
    copies = m.take_copies()
    state = read_state(m)
    assert state.tables == {"A": m.block_table("A"), "B": m.block_table("B")}
    assert state.ref == [m.ref_count(b) for b in range(6)]
    d = draw(state, figures.colors(["A", "B"]), ["caption"], "t",
             Marks(copies={dst: src for src, dst in copies}))
    a, b = m.block_table("A"), m.block_table("B")
    assert f"  A     7 tokens   #{a[0]} #{a[1]}" in d.text.splitlines()
    assert f"  B     6 tokens   #{b[0]} #{b[1]}" in d.text.splitlines()
    assert f"  #{a[0]:<3} ****  x2  A B" in d.text.splitlines()     # shared, full
    assert f"copy of #{copies[0][0]}" in d.text
    labels = [t.text for t in ET.fromstring(d.svg).iter(f"{SVG}text")]
    assert labels.count(f"#{a[0]}") == 3           # two table cells and its pool box
    assert "×2" in labels and "physical blocks (the pool): 6 × 4 slots · 3 in use · 3 free" \
        in labels


def test_the_hint_for_stale_figures_names_their_folder(tmp_path, monkeypatch, capsys):
    """Its rebuild must write the folder that was checked, not slides/figures."""
    from minipaged.kit.cli import main

    monkeypatch.setattr(figures, "stale", lambda out: iter(["paging"]))
    folder = tmp_path / "my [figs]"
    folder.mkdir()
    assert main(["present", "--check-figures", "--figures-dir", str(folder)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"regenerate with: minipaged present --build-figures --figures-dir '{folder}'" in out
    assert main(["present", "--check-figures"]) == 1
    assert " ".join(capsys.readouterr().out.split()).endswith("present --build-figures")
