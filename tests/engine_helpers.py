"""What the paged engine's tests share: the prompts, the tolerance, the check that nothing leaked.

The engine is checked against the reference generator in tests/test_engine.py (the tokens,
whatever the paging), tests/test_engine_backends.py (the CUDA kernels, on the CPU harness and
on a GPU) and tests/test_engine_errors.py (bad inputs, hangs, interruptions). Their fixtures,
``model`` (the shipped checkpoint) and ``reference`` (its reference greedy outputs for
``PROMPTS``), are in tests/conftest.py.
"""

from __future__ import annotations

from invariants import check_invariants

PROMPTS = [
    "count down from 9:", "count down from 52:", "count down from 13:", "count down from 20:",
    "count down from 3:", "count down from 37:", "Hello, paged world!", "x", "",
    "count down from 0:", "~!@# {}[] 0123",
]
MAX_TOKENS = 36
LOGIT_ATOL = 1e-4


def check_pool_full(llm):
    check_invariants(llm.manager)
    assert llm.manager.num_free_blocks == llm.num_blocks, "blocks leaked after generate"
    assert llm.manager.seq_ids == []
