"""Moved to ``minipaged.sharing.prefix_cache`` (0.2); re-exported for one release."""

from minipaged.sharing.prefix_cache import *  # noqa: F401,F403
