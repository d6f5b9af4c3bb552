"""The grading engine: load a learner's file from any path, run hidden cases, say what is wrong.

A hidden case (``grader/ex_*.py``) is a function of the learner's module. It checks with
``agree`` (the one way to compare a learner's function with a reference on many inputs),
``equal``, ``rejects`` (the call must raise and change nothing) and ``expect``; each failure is a
``CaseFailure`` with the inputs, the expected and the actual value, and may carry a hint more
precise than its case's, so a hint speaks to what went wrong. An untouched exercise (``raise
NotImplementedError``) reads as "not started"; any other exception is one line plus the
learner's line where it happened; a case that runs too long is stopped (where SIGALRM exists)
instead of hanging.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import itertools
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np


class CaseFailure(AssertionError):
    """A hidden case found a wrong answer: what a learner needs to reproduce it, and a hint."""

    def __init__(self, message: str, *, inputs: Any = None, expected: Any = None,
                 got: Any = None, hint: str = "") -> None:
        super().__init__(message)
        self.message, self.inputs, self.expected, self.got, self.hint = (
            message, inputs, expected, got, hint)


def expect(condition: bool, message: str, *, inputs: Any = None, expected: Any = None,
           got: Any = None, hint: str = "") -> None:
    if not condition:
        raise CaseFailure(message, inputs=inputs, expected=expected, got=got, hint=hint)


def _first_difference(got: np.ndarray, want: np.ndarray, tol: float) -> tuple[int, ...] | None:
    """Index of the first element that differs (NaN equals NaN here), or None. With tol > 0,
    "differs" means |got - want| > tol * (1 + |want|), computed in float64."""
    if tol:
        g, w = got.astype(np.float64), want.astype(np.float64)
        same = np.abs(g - w) <= tol * (1 + np.abs(w))
    else:
        same = np.asarray(got == want)
        if got.dtype.kind == want.dtype.kind == "f":
            same |= np.isnan(got) & np.isnan(want)
    bad = np.argwhere(np.atleast_1d(~same))
    return tuple(int(i) for i in bad[0][:got.ndim]) if bad.size else None  # () for a number


def equal(got: Any, want: Any, message: str, inputs: Any = None, *, tol: float = 0.0,
          hint: str = "") -> None:
    """``got`` must equal ``want`` (numbers and arrays within ``tol``, see _first_difference,
    when tol > 0); a failure shows exactly the values that differ."""
    if tol or isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
        g, w = np.asarray(got), np.asarray(want)
        expect(g.shape == w.shape, f"{message}: wrong shape", inputs=inputs, expected=w.shape,
               got=g.shape, hint=hint)
        idx = _first_difference(g, w, tol)
        if idx is not None:
            where = ([f"first difference at index {list(idx)}"] if idx else []) + (
                [f"beyond the tolerance {tol:g}"] if tol else [])
            # small arrays in full; of a big one (or a number) only the element that differs
            whole = 0 < w.ndim and w.size <= 32
            raise CaseFailure(message + (f" ({', '.join(where)})" if where else ""),
                              inputs=inputs, hint=hint,
                              expected=w if whole else np.asarray(w[idx]).item(),
                              got=g if whole else np.asarray(g[idx]).item())
    elif isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():
        diff = [k for k in want if got[k] != want[k]]
        if diff:
            raise CaseFailure(f"{message} (only the entries that differ are shown)",
                              inputs=inputs, expected={k: want[k] for k in diff},
                              got={k: got[k] for k in diff}, hint=hint)
    elif isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)) \
            and len(got) == len(want) and got != want:
        i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        small = len(want) <= 32
        raise CaseFailure(f"{message} (first difference at index {i})", inputs=inputs,
                          expected=want if small else want[i], got=got if small else got[i],
                          hint=hint)
    else:
        expect(got == want, message, inputs=inputs, expected=want, got=got, hint=hint)


def _parameter_names(fn: Callable, n: int) -> list[str]:
    """The names of ``fn``'s first ``n`` parameters (the exercise's, in a learner's function),
    or "argument 0", ... where the signature does not say (``*args``, a builtin)."""
    try:
        names = list(inspect.signature(fn).parameters)[:n]
    except (TypeError, ValueError):
        names = []
    return names if len(names) == n else [f"argument {i}" for i in range(n)]


def agree(fn: Callable, oracle: Callable, cases: Iterable[tuple], message: str, *,
          convert: Callable[[Any], Any] = lambda x: x, tol: float = 0.0, hint: str = "") -> None:
    """The one way to compare a learner's function with a reference: for each tuple of
    arguments in ``cases``, ``convert(fn(*args))`` must ``equal`` ``oracle(*args)``. The
    learner gets a copy of the arguments, so the first mismatch shows, by parameter name, the
    inputs it was given."""
    for args in cases:
        got = convert(fn(*copy.deepcopy(args)))
        inputs = dict(zip(_parameter_names(fn, len(args)), args))
        equal(got, oracle(*args), message, inputs, tol=tol, hint=hint)


def rejects(call: Callable[[], Any], kinds: type | tuple[type, ...], message: str,
            inputs: Any = None, *, state: Callable[[], Any] | None = None,
            hint: str = "") -> None:
    """``call()`` must raise one of ``kinds``, and ``state()`` must be unchanged by it.

    NotImplementedError passes through, so an untouched function reads as "todo"."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    names = " or ".join(k.__name__ for k in kinds) + " raised"
    before = state() if state is not None else None
    try:
        value = call()
    except NotImplementedError:
        raise
    except kinds:
        if state is not None:
            equal(state(), before, f"the rejected call changed the state ({message})", inputs,
                  hint="check every argument before changing anything: a call that raises "
                       "must leave every structure as it was")
        return
    except Exception as e:  # noqa: BLE001 - a wrong exception type is a failure to report
        raise CaseFailure(message, inputs=inputs, expected=names,
                          got=f"{type(e).__name__}: {e}", hint=hint) from None
    raise CaseFailure(message, inputs=inputs, expected=names,
                      got=f"no exception; returned {value!r}", hint=hint)


@dataclass
class Case:
    name: str
    run: Callable[[ModuleType], None]
    hint: str


@dataclass
class Exercise:
    """One exercise: its file name (without .py), title, the functions to write, hidden cases."""

    name: str                      # e.g. "06_paged_gather": exercises/06_paged_gather.py
    title: str
    functions: tuple[str, ...]     # names the learner's module must define
    cases: list[Case] = field(default_factory=list)

    @property
    def number(self) -> int:
        return int(self.name.split("_", 1)[0])

    def case(self, name: str, hint: str) -> Callable[[Callable], Callable]:
        """Decorator: register a hidden case under a readable name, with its hint."""
        def deco(fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
            self.cases.append(Case(name, fn, hint))
            return fn
        return deco


@dataclass
class CaseResult:
    name: str
    status: str                    # "pass" | "fail" | "todo" | "error" | "timeout"
    detail: str = ""
    failure: CaseFailure | None = None
    where: str = ""                # learner file location of an exception, "file:line: code"
    hint: str = ""


@dataclass
class GradeResult:
    exercise: Exercise
    path: Path
    results: list[CaseResult]
    load_error: str = ""

    @property
    def passed(self) -> bool:
        return not self.load_error and all(r.status == "pass" for r in self.results)

    @property
    def untouched(self) -> bool:
        return bool(self.results) and all(r.status == "todo" for r in self.results)


_counter = itertools.count()


def load_module(path: Path) -> ModuleType:
    """Import a Python file from any path under a fresh module name; ValueError if it fails."""
    name = f"_minipaged_learner_{path.stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module     # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise ValueError(f"syntax error in {path.name} line {e.lineno}: {e.msg}\n"
                         f"    {(e.text or '').rstrip()}") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - anything its top level raises
        sys.modules.pop(name, None)   # (sys.exit() too: it must not end the grader with 0)
        raise ValueError(f"importing {path.name} raised {type(e).__name__}: {e}"
                         f"{_learner_location(e, path)}") from None
    return module


def _learner_frame(exc: BaseException, path: Path) -> traceback.FrameSummary | None:
    """The innermost traceback frame of ``exc`` inside the learner's file, if any."""
    target = path.resolve()
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if Path(f.filename).resolve() == target]
    return frames[-1] if frames else None


def _learner_location(exc: BaseException, path: Path) -> str:
    f = _learner_frame(exc, path)
    return f"\n    at {path.name}:{f.lineno} in {f.name}(): {(f.line or '').strip()}" if f else ""


MAX_TIMEOUT_S = 86400  # a day: the timer (setitimer) overflows not far above 1e9 s


class CaseTimeout(Exception):
    """A case ran longer than its time limit (an endless loop in the learner's code?)."""


def _with_timeout(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()``, raising ``CaseTimeout`` after ``seconds`` where SIGALRM exists (Unix, main
    thread). Elsewhere the case simply runs to completion."""
    if not (hasattr(signal, "SIGALRM") and seconds > 0
            and threading.current_thread() is threading.main_thread()):
        return fn()

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"stopped after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:  # the alarm may fire as soon as it is set: inside the try, so it is always handled
        signal.setitimer(signal.ITIMER_REAL, seconds)
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_case(case: Case, module: ModuleType, path: Path, timeout_s: float) -> CaseResult:
    try:
        _with_timeout(lambda: case.run(module), timeout_s)
    except NotImplementedError as e:
        frame = _learner_frame(e, path)
        return CaseResult(case.name, "todo",
                          f"{frame.name if frame else '?'}() still raises NotImplementedError")
    except CaseFailure as e:
        return CaseResult(case.name, "fail", e.message, failure=e, hint=e.hint or case.hint)
    except CaseTimeout as e:
        return CaseResult(case.name, "timeout", f"{e} (an endless loop?)", hint=case.hint)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the learner's code may raise anything
        msg = str(e).splitlines()[0][:300] if str(e) else ""
        return CaseResult(case.name, "error", f"{type(e).__name__}: {msg}",
                          where=_learner_location(e, path).strip(), hint=case.hint)
    return CaseResult(case.name, "pass")


def grade(exercise: Exercise, path: Path, *, timeout_s: float = 20.0) -> GradeResult:
    """Import ``path`` and run every hidden case of ``exercise`` against it (each case stopped
    after ``timeout_s`` seconds where the platform allows; 0 = no limit)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not 0 <= timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s={timeout_s!r} must be a number of seconds in [0, "
                         f"{MAX_TIMEOUT_S}]")
    path = Path(path)
    try:  # the import runs the file's top level: an endless loop there is stopped too
        module = _with_timeout(lambda: load_module(path), timeout_s)
    except ValueError as e:
        return GradeResult(exercise, path, [], load_error=str(e))
    except CaseTimeout as e:
        return GradeResult(exercise, path, [], load_error=f"importing {path.name}: {e}")
    missing = [f for f in exercise.functions if not hasattr(module, f)]
    if missing:
        return GradeResult(exercise, path, [], load_error=(
            f"{path.name} does not define {', '.join(missing)}; is it exercise "
            f"{exercise.name}? (its EXERCISE marker or file name says so)"))
    return GradeResult(exercise, path, [run_case(c, module, path, timeout_s)
                                        for c in exercise.cases])
