"""Moved to ``minipaged.serving.scheduler`` (0.2); re-exported for one release."""

from minipaged.serving.scheduler import *  # noqa: F401,F403
from minipaged.sharing.sequence import *  # noqa: F401,F403 - the 0.1 module re-exported these
