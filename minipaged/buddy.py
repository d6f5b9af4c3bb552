"""Moved to ``minipaged.contiguous.buddy`` (0.2); re-exported for one release."""

from minipaged.contiguous.buddy import *  # noqa: F401,F403
