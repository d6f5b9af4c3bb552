"""The serving simulator: the paper's experiments with the project's own scheduler and managers.

Read in this order: ``workloads.py`` (who asks for how many tokens, and when), ``memory.py``
(how many token slots a model leaves on a GPU; ``minipaged kv-calc``), ``cost.py`` (how long a
step takes), ``executor.py`` (the stand-in model: step times and tokens), ``simulator.py`` (the
loop; ``minipaged simulate``), ``experiments.py`` (the paper's figures;
``minipaged experiment N``). The command-line glue is in ``kit/cli/simulation.py``.
"""


def pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal (None: "-"): the one format of every table
    of the simulator and the quiz. Here, not in experiments.py, so that a table can use it
    without loading the simulator."""
    return "-" if x is None else f"{100 * x:.1f}%"
