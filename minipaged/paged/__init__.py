"""Stage 3, paging (lesson 03): physical blocks, block tables, and attention that follows them.

Read in this order: ``block_allocator.py``, ``block_manager.py``, ``cache_ops.py``,
``paged_attention.py``. Then stage 4, ``sharing/``.
"""
