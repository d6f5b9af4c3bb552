"""The install commands that every "needs torch" or "needs CuPy" message prints, in one place.

What it teaches: nothing; it keeps the hints true. They give the commands that work from a
checkout of this repository (minipaged is installed with ``pip install -e``, not from an
index), and for torch the CPU wheel first: a plain ``pip install torch`` on Linux pulls a
multi-GB CUDA build. README.md's "Before you start" shows the same commands;
tests/test_install_hints.py checks that every printed hint and the README agree, and that no
other module spells out an install command of its own.
"""

from __future__ import annotations

TORCH_CPU_WHEEL = "python -m pip install torch --index-url https://download.pytorch.org/whl/cpu"
TORCH_EXTRA = 'python -m pip install -e ".[torch]"'
GPU_EXTRA = 'python -m pip install -e ".[gpu]"'
HF_EXTRA = 'python -m pip install -e ".[hf]"'
TEST_EXTRA = 'python -m pip install -e ".[test]"'

TORCH_STEPS = f"from a checkout: {TORCH_CPU_WHEEL} (the CPU wheel), then {TORCH_EXTRA}"
TORCH_HINT = f"needs torch; {TORCH_STEPS}"
GPU_HINT = f"from a checkout: {GPU_EXTRA}"
TEST_STEPS = f"from a checkout: {TEST_EXTRA}"
