"""The MINIPAGED_REQUIRE switch: a skip for a required capability must become a failure."""

import subprocess
import sys
import textwrap

import pytest
from capabilities import KNOWN, have, required


def _run_pytest(tmp_path, env_require: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_needs_missing.py"
    test.write_text(textwrap.dedent("""
        from capabilities import require
        import capabilities
        def test_missing(monkeypatch):
            monkeypatch.setattr(capabilities, "have", lambda cap: False)
            require("torch")
    """))
    import os
    env = dict(os.environ, MINIPAGED_REQUIRE=env_require)
    root = __import__("pathlib").Path(__file__).parent
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test),
         "--rootdir", str(tmp_path), "-o", f"pythonpath={root}", "--confcutdir", str(tmp_path)],
        capture_output=True, text=True, env=env)


def test_missing_capability_skips_when_not_required(tmp_path):
    out = _run_pytest(tmp_path, "")
    assert "1 skipped" in out.stdout, out.stdout + out.stderr


def test_missing_capability_fails_when_required(tmp_path):
    out = _run_pytest(tmp_path, "torch")
    assert out.returncode != 0
    assert "1 failed" in out.stdout, out.stdout + out.stderr
    assert "MINIPAGED_REQUIRE" in out.stdout


def test_unknown_capability_is_an_error(monkeypatch):
    with pytest.raises(ValueError, match="unknown capability"):
        have("tpu")
    monkeypatch.setenv("MINIPAGED_REQUIRE", "torch,quantum")
    with pytest.raises(ValueError, match="quantum"):
        required()


def test_known_capabilities_are_booleans():
    for cap in KNOWN:
        assert have(cap) in (True, False)
