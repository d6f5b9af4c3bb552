"""What the command-line error tests share (tests/test_cli*.py, whose tables of bad command
lines tests/test_cli_errors.py lists): running ``minipaged`` in a subprocess, the files the
lines name, and the one check every line of a table must pass.

Each line runs in its own interpreter with a timeout (a hang fails) and an address-space limit
of 16 GiB (so "would need about N of memory" refusals do not depend on the machine, and a size
check that forgot to refuse cannot eat the machine). A table is a list of (command line after
``minipaged``, a fragment its error message must contain); {name} in a line is a file made by
``run_table`` (``_files`` below).
"""

from __future__ import annotations

import os
import resource
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from capabilities import require

ROOT = Path(__file__).resolve().parent.parent
BIG = 10**12
TORCH = ("generate", "train", "bench generate")


def _files(tmp: Path) -> dict[str, str]:
    texts = {
        "file": "just text\n", "garbage": "{not json\n", "nested": "[" * 100_000 + "]" * 100_000,
        "array": "[1, 2]\n", "no_output": '{"prompt_len": 5}\n', "empty": "",
        "negative": '{"prompt_len": -1, "output_len": 5}\n',
        "nan_arrival": '{"prompt_len": 5, "output_len": 5, "arrival_s": NaN}\n',
        "timed": '{"prompt_len": 5, "output_len": 5, "arrival_s": 0.5}\n',
        "too_long": '{"prompt_len": 5000, "output_len": 5}\n', "unclosed": "---\nmarp: true\n# x\n",
        "bad_demo": "# one\n\n---\n\n# two\n<!-- demo: nope -->\n",
    }
    out = {}
    for name, text in texts.items():
        (tmp / f"{name}.txt").write_text(text)
        out[name] = str(tmp / f"{name}.txt")
    (tmp / "binary.bin").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01" * 64)
    (tmp / "binary.py").write_bytes(b"\xff\xfe\x00" * 64)
    (tmp / "adir").mkdir()
    (tmp / "model.json").mkdir()      # where train --out model.pt would write its report
    out.update(binary=str(tmp / "binary.bin"), binary_py=str(tmp / "binary.py"),
               dir=str(tmp / "adir"), missing=str(tmp / "missing.jsonl"),
               model_pt=str(tmp / "model.pt"), missing_py=str(tmp / "missing.py"),
               missing_dir=str(tmp / "no" / "such"))
    return out


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (16 * 2**30, resource.RLIM_INFINITY))


def run_cli(argv: list[str], timeout: float = 120, env: dict | None = None,
            stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", "TERM": "dumb", **(env or {})}
    env.setdefault("MINIPAGED_TRACEBACK", "")
    return subprocess.run([sys.executable, "-m", "minipaged", *argv], cwd=ROOT, env=env,
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, preexec_fn=_limit_memory)


def ids(cases: list[tuple[str, str]]) -> list[str]:
    """The test id of each line of a table: the line itself."""
    return [line or "(nothing)" for line, _ in cases]


def run_table(cases: list[tuple[str, str]], tmp_path_factory
              ) -> dict[str, subprocess.CompletedProcess | str]:
    """Every case of the table, two at a time (each is a separate interpreter)."""
    files = _files(tmp_path_factory.mktemp("bad_inputs"))

    def one(line: str):
        try:
            return run_cli(shlex.split(line.format(**files)))
        except subprocess.TimeoutExpired:
            return "hang"
    lines = [line for line, _ in cases]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(lines, pool.map(one, lines)))


def check_one_clear_line(results: dict, line: str, fragment: str,
                         cases: list[tuple[str, str]]) -> None:
    """``minipaged LINE`` finished with exit status 2 and one line on stderr, no traceback,
    holding ``fragment`` and, where the line names a command of the table, naming it."""
    commands = {case.split()[0] for case, _ in cases if case and case != "nope"}
    if line.startswith(TORCH) and line not in ("generate", "bench generate"):
        require("torch")
    out = results[line]
    assert out != "hang", f"minipaged {line} did not finish"
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]
    assert out.returncode == 2, (out.returncode, out.stdout[-1000:], out.stderr[-1000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipaged"), out.stderr
    assert fragment in lines[0], lines[0]
    command = line.split()[0] if line else ""
    if command in commands:  # the error names the command it is about
        assert lines[0].startswith(f"minipaged {command}"), lines[0]
