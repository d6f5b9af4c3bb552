"""The vLLM files the interview drills cite say what the drills say they say (vLLM 0.32).

Runs with the other vLLM tests, in the environment where vLLM is installed (.ci/run).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_drills_systems import CITED

pytestmark = pytest.mark.requires("vllm")


def test_cited_vllm_files_say_what_the_drills_say():
    root = Path(importlib.util.find_spec("vllm").origin).parent.parent
    for path, needles in CITED.items():
        f = root / path
        assert f.exists(), path
        text = "\n".join(sorted(x.name for x in f.iterdir())) if f.is_dir() else f.read_text()
        for needle in needles:
            assert needle in text, (path, needle)
