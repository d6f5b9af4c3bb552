"""Moved to ``minipaged.paged.cache_ops`` (0.2); re-exported for one release."""

from minipaged.paged.cache_ops import *  # noqa: F401,F403
