"""Shared test configuration: Hypothesis profiles and the ``requires`` marker.

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
