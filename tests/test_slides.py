"""The slide deck, its figures and the terminal presenter.

Promises tested here:
- the deck has 30 to 50 slides, each with speaker notes;
- every file the deck references exists, with its text twin, and every SVG parses as XML;
- no committed figure is stale: a fresh drawing from the managers, the simulator and the
  fact-check equals the committed SVG and text twin byte for byte, and the manifest's hashes
  (rebuild: ``minipaged present --build-figures``);
- the figures are legible at 1280x720 from the back of a room: drawn diagrams, not terminal
  captures, shown at the size they are drawn, no text below 16 px on the slide, only glyphs that
  DejaVu Sans and Liberation Sans both have;
- the block-table diagram shows exactly what the manager holds;
- Marp renders the deck to HTML (and, where Chromium is installed, to 1280x720 PNGs);
- the 45-minute plan in slides/README.md covers every slide once;
- every ``<!-- demo: SCENE -->`` names a real demo scene;
- the presenter prints every slide without waiting when stdout is not a terminal, and pages
  forward, back and through notes on key presses in a terminal.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from minipaged.kit import diagrams, figures, present

ROOT = Path(__file__).resolve().parent.parent
SLIDES = ROOT / "slides"
FIGURES = SLIDES / "figures"
DECKS = sorted(SLIDES.glob("*.md"))
DECKS = [d for d in DECKS if d.name != "README.md"]


SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def fresh() -> dict[str, diagrams.Drawing]:
    return figures.render_all()


def deck_slides() -> list[present.Slide]:
    return present.parse_deck(DECKS[0].read_text(encoding="utf-8"))


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
    made = figures.build(out)
    assert not (out / "old_capture.svg").exists() and not (out / "old_capture.txt").exists()
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
