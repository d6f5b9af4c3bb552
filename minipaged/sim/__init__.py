"""The serving simulator: the paper's experiments with the project's own scheduler and managers.

Read in this order: ``workloads.py`` (who asks for how many tokens, and when), ``memory.py`` (how
many token slots a model leaves on a GPU; ``minipaged kv-calc``), ``cost.py`` (how long a step
takes), ``executor.py`` (the stand-in model: step times and tokens), ``config.py`` (what one run is
asked to do), ``simulator.py`` (the loop; ``minipaged simulate``), ``experiments.py`` (the paper's
figures; ``minipaged experiment N``); ``host.py`` refuses a run too big for this machine. The
command-line glue is in ``kit/cli/simulation.py``.
"""


def pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal (None: "-"): the one format of every table
    of the simulator and the quiz. Here, not in experiments.py, so that a table can use it
    without loading the simulator."""
    return "-" if x is None else f"{100 * x:.1f}%"


def table(title: str, columns, *, left=(), **kw):
    """A rich Table with these columns: figures right-justified, the ``left`` ones left. The
    one table of the experiments and the command line (``kit/cli/common.py`` re-exports it)."""
    from rich.table import Table

    t = Table(title=title, **kw)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right")
    return t


def nbytes(n: float) -> str:
    """Bytes with a binary unit: 512 B, 8.00 KiB, 1.25 GiB (here for ``host.py``'s refusals)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} PiB"
