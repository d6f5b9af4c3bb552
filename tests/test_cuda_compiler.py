"""No C++20 compiler: the CPU harness says so clearly instead of failing somewhere deep.

These tests need no compiler at all (they point CXX at one that cannot work), so they run on
every machine. ``cpu_build.compiler()`` is cached per process: each test clears the cache before
and after, so the real compiler is found again by the tests that follow.
"""

from __future__ import annotations

import pytest

from minipaged.cuda.emu import cpu_build


@pytest.fixture
def fresh_probe(monkeypatch):
    cpu_build.compiler.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    cpu_build.compiler.cache_clear()


def test_missing_compiler_is_named_with_a_fix(fresh_probe, tmp_path):
    missing = str(tmp_path / "no-such-g++")
    fresh_probe.setenv("CXX", missing)
    with pytest.raises(cpu_build.CompilerNotFoundError,
                       match=r"C\+\+20 compiler.*not on PATH.*set CXX") as info:
        cpu_build.compiler()
    assert missing in str(info.value)
    assert cpu_build.have_compiler() is False


def test_compiler_that_rejects_cpp20_is_refused(fresh_probe, tmp_path):
    old = tmp_path / "old-g++"  # a "compiler" that rejects every command line, like g++ 7 would
    old.write_text("#!/bin/sh\nexit 1\n")
    old.chmod(0o755)
    fresh_probe.setenv("CXX", str(old))
    with pytest.raises(cpu_build.CompilerNotFoundError, match=r"rejects -std=c\+\+20"):
        cpu_build.compiler()

