"""Stage 5, serving (lesson 06): sequences, the memory policy, swapping and the scheduler.

Read in this order: ``memory_policy.py``, ``swap.py``, ``scheduler.py``. Then
the simulator (``sim/``) that runs them on the paper's workloads, and stage 6, ``cuda/``.
"""
