"""Stage 2, the contiguous KV cache (lesson 02): what systems before vLLM did, and its waste.

Read in this order: ``usage.py`` (the five categories of KV cache memory), ``buddy.py`` (how a
contiguous region is placed), ``cache.py`` (Orca-style reservations). Then stage 3, ``paged/``.

``minipaged.contiguous`` was a single module before 0.2; its names are re-exported here.
"""

from minipaged.contiguous.buddy import BuddyAllocator, OutOfMemoryError
from minipaged.contiguous.cache import *  # noqa: F401,F403
from minipaged.contiguous.cache import ContiguousKVCache
from minipaged.contiguous.usage import KVUsage

__all__ = ["BuddyAllocator", "ContiguousKVCache", "KVUsage", "OutOfMemoryError"]
