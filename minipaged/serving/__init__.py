"""Stage 5, serving (lesson 06): swapping, the memory policy, the queues and the scheduler.

Read in this order: ``swap.py``, ``memory_policy.py``, ``queues.py``, ``scheduler.py``. Then the
simulator (``sim/``) that runs them on the paper's workloads, and stage 6, ``cuda/``.
"""
