"""Moved to ``minipaged.serving.swap`` (0.2); re-exported for one release."""

from minipaged.serving.swap import *  # noqa: F401,F403
