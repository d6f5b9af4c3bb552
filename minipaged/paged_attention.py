"""Moved to ``minipaged.paged.paged_attention`` (0.2); re-exported for one release."""

from minipaged.paged.paged_attention import *  # noqa: F401,F403
