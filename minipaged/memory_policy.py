"""Moved to ``minipaged.serving.memory_policy`` (0.2); re-exported for one release."""

from minipaged.serving.memory_policy import *  # noqa: F401,F403
