"""Shared test configuration: Hypothesis profiles, the ``requires`` marker, and the fixtures that
several test files share (each defined once here, imported only when a test asks for it).

Profiles (choose with HYPOTHESIS_PROFILE, default ``dev``):
    dev  fast feedback while editing: fewer examples, random seeds.
    ci   derandomized (the same examples every run) with no deadline, so a slow CI machine
         cannot make a test flaky.
"""

from __future__ import annotations

import os

import pytest
from capabilities import require
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=40, deadline=None)
settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers(name="requires"):
        for cap in mark.args:
            require(cap)


# ---- fixtures shared by the files of one topic -------------------------------------------------


@pytest.fixture(scope="session")
def model():
    """The shipped checkpoint (tests/test_engine*.py): loaded once, on one torch thread."""
    import torch

    from minipaged.model.checkpoint import load_model
    torch.set_num_threads(1)
    return load_model()


@pytest.fixture(scope="session")
def reference(model):
    """Reference greedy outputs, computed once per prompt (the oracle never changes)."""
    from engine_helpers import MAX_TOKENS, PROMPTS

    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams
    outs = ReferenceGenerator(model).generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS),
                                             return_logits=True)
    return {o.prompt: o.outputs[0] for o in outs}


@pytest.fixture(scope="module")
def library():
    """The CPU harness of the CUDA kernels (tests/test_cuda_cpu*.py), built (or loaded from the
    cache) once per module."""
    from minipaged.cuda.emu import cpu_build

    try:
        return cpu_build.load()
    except cpu_build.CompilerNotFoundError as e:
        require("cuda-cpu", why=str(e))
    # a BuildError propagates: sources that do not compile are a failure, never a skip


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Tiny random Llama, Qwen2 and Qwen3 checkpoints (tests/test_hf_model*.py, which skip
    without torch and transformers), built once: family -> (folder, transformers model)."""
    import torch
    from hf_helpers import FAMILIES, _build

    torch.set_num_threads(1)        # tiny matrices: threads only add contention
    out = {}
    for family in FAMILIES:
        d = tmp_path_factory.mktemp(family)
        out[family] = (d, _build(family, d))
    return out
