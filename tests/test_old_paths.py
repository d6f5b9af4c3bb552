"""The module paths of 0.1 import for one release (CHANGELOG.md, 0.2.0's table), and importing
one changes nothing a learner uses at the top level."""

from __future__ import annotations

import importlib
import pathlib

import numpy as np
import pytest

import minipaged
from minipaged.paged.paged_attention import paged_attention

PKG = pathlib.Path(minipaged.__file__).parent
OLD = sorted(p.stem for p in PKG.glob("*.py") if p.read_text().startswith('"""Moved to'))


@pytest.fixture(autouse=True)
def _top_level_function_restored():
    yield  # (so that no later test sees the module where the function was)
    minipaged.paged_attention = paged_attention


def test_there_are_old_paths():
    assert "kv_cache" in OLD and "paged_attention" in OLD


@pytest.mark.parametrize("name", OLD)
def test_an_old_path_imports_its_names_from_the_new_one(name):
    old = importlib.import_module(f"minipaged.{name}")
    public = [n for n in vars(old) if not n.startswith("_") and n not in ("sys", "types")]
    assert public, f"minipaged.{name} re-exports nothing"
    for n in public:
        value = getattr(old, n)
        home = getattr(value, "__module__", None)
        if home and home.startswith("minipaged."):  # defined in the new place, not a copy
            assert importlib.import_module(home) is not old, f"{name}.{n} is defined in the shim"


def test_importing_the_old_paged_attention_path_keeps_the_function_callable():
    # ``from minipaged.paged_attention import ...`` binds minipaged.paged_attention to the
    # module, over the top-level function: it was "'module' object is not callable".
    importlib.import_module("minipaged.paged_attention")
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((4, 2, 4, 8)).astype(np.float32)  # [NB, Hkv, BS, D]
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    args = (q, cache, cache + 1, np.array([[2, 0]], np.int32), np.array([6], np.int32))
    assert np.array_equal(minipaged.paged_attention(*args), paged_attention(*args))
