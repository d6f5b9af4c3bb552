"""Every lesson is a runnable script: run each one as a learner would, and check it succeeds.

Lessons are jupytext percent-format files (``# %%`` cells); they must finish in seconds on a
laptop CPU and print something. A lesson that needs torch is marked by the line
``# requires: torch`` near its top, and is then run only where torch exists (or fails where
MINIPAGED_REQUIRE demands torch).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from capabilities import require

LESSONS = sorted((Path(__file__).resolve().parent.parent / "lessons").glob("[0-9][0-9]_*.py"))


def test_there_are_lessons():
    assert len(LESSONS) >= 1, "lessons/ holds no NN_name.py scripts"


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs(lesson: Path):
    text = lesson.read_text()
    assert "# %%" in text, f"{lesson.name} is not in jupytext percent format (no '# %%' cells)"
    for line in text.splitlines()[:30]:
        if line.startswith("# requires:"):
            for cap in line.split(":", 1)[1].split(","):
                require(cap.strip())
    env = dict(os.environ, COLUMNS="100", TERM="dumb")
    out = subprocess.run([sys.executable, str(lesson)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=lesson.parent.parent)
    assert out.returncode == 0, f"{lesson.name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    assert out.stdout.strip(), f"{lesson.name} printed nothing"
