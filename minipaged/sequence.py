"""Moved to ``minipaged.sharing.sequence`` (0.2); re-exported for one release."""

from minipaged.sharing.sequence import *  # noqa: F401,F403
