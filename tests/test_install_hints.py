"""Install hints: every message that says how to install torch or CuPy gives the README's commands.

Promises tested here:
- minipaged/_install.py is the one module that spells out an install command: no other string
  in the package says ``pip install``;
- README.md's "Before you start" shows the same commands, in a shell block, beside the
  Quickstart (which keeps exactly its two commands);
- ``generate``, ``bench generate`` and ``train`` without torch print ``TORCH_HINT`` as their
  one error line, the demo's model scene gives it as the reason it cannot play, and the CuPy
  messages (``bench kernel``, the CUDA launcher, the model runner) give ``GPU_HINT``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minipaged import _install

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minipaged"


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module (f-string pieces included), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_only_one_module_spells_out_install_commands():
    found = [f"{p.relative_to(ROOT)}:{line}: {s!r}"
             for p in sorted(PACKAGE.rglob("*.py")) if p.name != "_install.py"
             for line, s in _strings(p) if re.search(r"pip\s+install", s)]
    assert not found, "install commands outside minipaged/_install.py:\n" + "\n".join(found)


def test_the_detector_sees_a_hint_written_elsewhere(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('def f(x):\n    raise ValueError(f"needs torch (pip install {x})")\n')
    assert any("pip install" in s for _, s in _strings(f))


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert m, f"README.md has no section {title!r}"
    return m.group(1)


def _shell_lines(section: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [line.strip() for b in blocks for line in b.splitlines() if line.strip()]


def test_the_readme_shows_the_same_commands():
    quick = _shell_lines(_readme_section("Quickstart"))
    assert quick == ['python -m pip install -e . && minipaged demo',
                     'python -m pip install -e ".[test]" && python -m pytest']
    before = _shell_lines(_readme_section("Before you start"))
    for command in (_install.TORCH_CPU_WHEEL, _install.TORCH_EXTRA, _install.GPU_EXTRA):
        assert command in before, f"README's 'Before you start' lacks {command!r}"
    assert before.index(_install.TORCH_CPU_WHEEL) < before.index(_install.TORCH_EXTRA)
    assert "python -m venv .venv && . .venv/bin/activate" in before


def _without_torch(argv: list[str]) -> subprocess.CompletedProcess:
    """``minipaged ARGV`` in a fresh interpreter where ``import torch`` finds nothing (a None
    entry in sys.modules is what importlib reports as "not installed")."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from minipaged.kit.cli import main\n"
            f"sys.exit(main({argv!r}))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400", "MINIPAGED_TRACEBACK": ""}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("argv", [["generate", "count down from 9:"], ["bench", "generate"],
                                  ["train"]], ids=" ".join)
def test_commands_that_need_torch_print_the_hint(argv):
    out = _without_torch(argv)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    name = " ".join(argv[:2]) if argv[0] == "bench" else argv[0]
    assert out.stderr.strip().splitlines() == [f"minipaged {name}: {_install.TORCH_HINT}"]


def test_the_demo_model_scene_gives_the_hint(monkeypatch):
    import importlib.util

    from minipaged.kit.viz.scenes.model import ModelScene

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    reason = ModelScene.missing()
    assert reason is not None and reason.endswith(_install.TORCH_HINT)


@pytest.mark.parametrize("argv", [["demo", "--list"], ["demo", "model"]])
def test_the_demo_prints_the_hint_whole(monkeypatch, capsys, argv):
    # rich would read the hint's ".[torch]" as markup and drop it
    from minipaged.kit.cli import main
    from minipaged.kit.viz.scenes.model import ModelScene

    monkeypatch.setattr(ModelScene, "missing", classmethod(lambda cls: _install.TORCH_HINT))
    main(argv)
    assert _install.TORCH_EXTRA in " ".join(capsys.readouterr().out.split())


def test_cupy_messages_give_the_gpu_hint(monkeypatch):
    from minipaged.cuda import cupy_runner, gpu_check

    monkeypatch.setitem(sys.modules, "cupy", None)          # "CuPy is not installed"
    assert gpu_check.gpu_missing() == f"CuPy is not installed ({_install.GPU_HINT})"
    with pytest.raises(RuntimeError) as e:
        cupy_runner.import_cupy()       # what every backend="cupy" launch goes through
    assert f"({_install.GPU_HINT})" in str(e.value)


@pytest.mark.requires("torch")
def test_the_model_runner_gives_the_gpu_hint(monkeypatch):
    import torch

    from minipaged.model import runner

    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(runner.BackendUnavailableError) as e:
        runner._cuda_device()           # what the engine calls for backend="cupy"
    assert f"({_install.GPU_HINT})" in str(e.value)
