"""What the runners share: which errors are the user's, memory limits, reading, output.

A runner checks what the parser cannot (sizes against the memory there is, files that must be
readable), then calls the package's plain functions and prints. A refusal is a ValueError
whose message names the argument, its value and what was expected; ``main`` prints it, as one
line, when ``user_errors`` counts its kind, described by ``describe``. The ``bench`` runners
(``minipaged/kit/bench/``) use the same memory checks, progress bar and tables. The memory
rule is ``minipaged/sim/host.py``'s, which ``simulate`` applies too; it is imported from here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from contextlib import contextmanager

from minipaged._checks import OutOfBlocksError
from minipaged._install import TORCH_HINT
from minipaged.sim import nbytes
from minipaged.sim import table as table
from minipaged.sim.host import SIM_BYTES_PER_BLOCK as SIM_BYTES_PER_BLOCK
from minipaged.sim.host import check_sim_size as check_sim_size
from minipaged.sim.host import refuse_if_too_big as refuse_if_too_big
from minipaged.sim.memory import preset

# ---- errors and sizes --------------------------------------------------------------------------


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions bad input causes. Errors of the package's own kinds count too, when the
    module that defines them was imported (a module never imported raised nothing)."""
    kinds: list[type[BaseException]] = [ValueError, TypeError, OSError, ArithmeticError,
                                        RecursionError, MemoryError, OutOfBlocksError]
    for module, name in (("minipaged.model.runner", "BackendUnavailableError"),
                         ("minipaged.cuda.emu.cpu_build", "CompilerNotFoundError"),
                         ("minipaged.cuda.emu.cpu_build", "BuildError")):
        if module in sys.modules:
            kinds.append(getattr(sys.modules[module], name))
    return tuple(kinds)


def describe(e: BaseException, what: str = "") -> str:
    """One line for an error: its message, or what the error means when it has none. ``what``
    names the file being read (``--workload='w.jsonl'``, from ``reading``)."""
    if isinstance(e, UnicodeDecodeError):
        return (f"{what or 'a file'} is not UTF-8 text (byte {e.start}: {e.reason}); expected "
                "a text file")
    if isinstance(e, RecursionError):
        return f"{what or 'the input'} nests too deeply to be read"
    if isinstance(e, OSError) and what:
        return f"{what} cannot be read: {e.strerror or e}"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename!r}: {e.strerror}" if e.filename else e.strerror
    if isinstance(e, MemoryError):
        return f"out of memory {e}".strip()
    return " ".join(str(e).split()) or type(e).__name__


def check_sim_blocks(model: str, kv_cache_gb: float | None, block_size: int) -> None:
    """Refuse a paged simulation whose KV budget holds no block, naming the flags (the
    simulator refuses it too, later, in its parameters' names)."""
    p = preset(model, kv_cache_gb=kv_cache_gb)
    if p.num_token_slots >= block_size:
        return
    budget = (f"--kv-cache-gb={kv_cache_gb:g}" if kv_cache_gb is not None
              else f"the {model} preset's {nbytes(p.kv_cache_bytes)} of KV cache")
    raise ValueError(f"{budget} holds {p.num_token_slots:,} token slots, less than one block of "
                     f"--block-size={block_size}; expected a smaller --block-size"
                     + (" or a larger --kv-cache-gb" if kv_cache_gb is not None else ""))


def need_torch() -> None:
    """Refuse a command that needs torch, with the install hint, where torch is missing."""
    if importlib.util.find_spec("torch") is None:
        raise ValueError(TORCH_HINT)


@contextmanager
def reading(flag: str, value: str):
    """Errors while reading the file an argument named become one line naming the argument."""
    try:
        yield
    except (UnicodeDecodeError, RecursionError, OSError) as e:
        raise ValueError(describe(e, f"{flag}={value!r}")) from None


# ---- output helpers ----------------------------------------------------------------------------

def progress_bar(console, label: str):
    """A rich progress bar as a context manager yielding ``update(done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True, disable=not console.is_terminal) as prog:
            task = prog.add_task(label, total=None)
            yield lambda done, total: prog.update(task, completed=done, total=total)
    return bar()


def _jsonable(obj):
    """JSON objects have string keys (results keyed by block size or width), and strict JSON
    has no Infinity (an all-at-once request rate is written "inf")."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def write_json(console, path: str, obj) -> None:
    """``obj`` as JSON into ``path``, the value of ``--json`` (the parser checked its folder;
    a full disk is still found only here)."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_jsonable(obj), f, indent=2, sort_keys=True, default=str, allow_nan=False)
            f.write("\n")
    except OSError as e:
        raise ValueError(f"--json={path!r} cannot be written: {e.strerror or e}") from None
    console.print(f"wrote {path}")
