"""Moved to ``minipaged.paged.block_allocator`` (0.2); re-exported for one release."""

from minipaged.paged.block_allocator import *  # noqa: F401,F403
