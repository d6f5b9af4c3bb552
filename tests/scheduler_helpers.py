"""What the scheduler's unit tests share: the cost model, a small paged policy and a loop that
runs a scheduler to the end on the simulated executor.

tests/test_scheduler.py checks what the scheduler plans (steps, chunked prefill, preemption,
samples, swapping, the whole-batch shortcut), tests/test_scheduler_errors.py what it refuses
and how it says so.
"""

from __future__ import annotations

from minipaged.serving.memory_policy import make_policy
from minipaged.serving.scheduler import Scheduler
from minipaged.sim.cost import CostModel
from minipaged.sim.executor import SimExecutor
from minipaged.sim.memory import preset

COST = CostModel.for_preset(preset("opt-13b"))


def paged(num_blocks=16, block_size=4, **kw):
    return make_policy("paged", num_slots=num_blocks * block_size, block_size=block_size,
                       max_seq_len=64, num_cpu_blocks=64, **kw)


def run(s: Scheduler, max_steps=10_000):
    ex = SimExecutor(COST, 1, seed=0)
    now, outs = 0.0, []
    while s.has_unfinished() and len(outs) < max_steps:
        out = s.schedule()
        res = ex.execute(out)
        now += res.duration_s
        s.update(out, res, now)
        outs.append(out)
    return outs
