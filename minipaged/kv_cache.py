"""Moved to ``minipaged.paged.block_manager`` (0.2); re-exported for one release."""

from minipaged.paged.block_manager import *  # noqa: F401,F403
