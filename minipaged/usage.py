"""Moved to ``minipaged.contiguous.usage`` (0.2); re-exported for one release."""

from minipaged.contiguous.usage import *  # noqa: F401,F403
