"""Moved to ``minipaged.serving.swap`` (0.2; the stages are in ``paged/``, ``sharing/``)."""

from minipaged._checks import OutOfBlocksError, check_token_ids  # noqa: F401
from minipaged.serving.swap import KVCacheManager  # noqa: F401
