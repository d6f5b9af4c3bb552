"""Moved to ``minipaged.serving.scheduler`` (0.2); re-exported for one release."""

from minipaged.serving.scheduler import *  # noqa: F401,F403
