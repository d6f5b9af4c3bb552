"""Classroom pictures of a paged KV cache, drawn with rich from the managers' real state.

The pieces, in the order to read them:

    palette.py   colour-blind-safe colours, each paired with a glyph or label (NO_COLOR works)
    labels.py    which letter and colour each sequence gets
    state.py     views: frozen snapshots read out of KVCacheManager / ContiguousKVCache
    blocks.py    block tables and the physical memory map (paged cache)
    arena.py     slot strips of contiguous arenas and waste bars (vLLM Fig. 2 categories)
    steplog.py   the step log: what happened this step
    scene.py     scenes and frames, and the probes that keep a scene out of the tour when the
                 features it needs are not in this checkout
    scenes/      the scenes of ``minipaged demo`` (player: ``minipaged/demo.py``)
"""

from __future__ import annotations

from minipaged.kit.viz.arena import slot_strip, waste_bars
from minipaged.kit.viz.blocks import block_tables, cpu_pool, memory_map
from minipaged.kit.viz.labels import Labels
from minipaged.kit.viz.state import ArenaView, PoolView, read_arena, read_pool
from minipaged.kit.viz.steplog import Event, step_log

__all__ = ["ArenaView", "Event", "Labels", "PoolView", "block_tables", "cpu_pool", "memory_map",
           "read_arena", "read_pool", "slot_strip", "step_log", "waste_bars"]
