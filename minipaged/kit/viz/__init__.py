"""Classroom pictures of a paged KV cache, drawn with rich from the managers' real state.

The pieces, in the order to read them:

    style.py     colour-blind-safe colours, each paired with a glyph or a letter (NO_COLOR works)
    state.py     views: frozen snapshots read out of KVCacheManager / ContiguousKVCache
    blocks.py    block tables and the physical memory map (paged cache)
    arena.py     slot strips and waste bars (the vLLM paper's Fig. 2 categories)
    scene.py     scenes, frames and the step log
    scenes/      the scenes of ``minipaged demo`` (the player: ``kit/demo.py``)
"""
