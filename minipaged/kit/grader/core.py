"""The grading engine: load a learner's file from any path, run hidden cases, report in rich.

What it teaches: nothing about paging; it is the referee that lets a learner work through
``exercises/`` alone. Each exercise has a set of hidden cases in ``minipaged/grader/ex_*.py``;
a case is a plain function that receives the learner's module and raises ``CaseFailure`` (with
the inputs, the expected and the actual value) when the learner's code is wrong.

The report must help, never frighten:
- an untouched exercise (``raise NotImplementedError`` still in place) gets a friendly
  "not started" message naming the functions to write, never a traceback;
- any other exception in the learner's code is shown as one line (type, message) plus the
  line of the learner's file where it happened;
- the first failing case is shown in full: its inputs, expected and actual values, and a hint;
- a case that runs too long is stopped (on platforms with SIGALRM) instead of hanging.

Read next: ``minipaged/grader/__init__.py`` (the list of exercises and ``minipaged check``).
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any


class CaseFailure(AssertionError):
    """A hidden case found a wrong answer: carries what a learner needs to reproduce it."""

    def __init__(self, message: str, *, inputs: Any = None, expected: Any = None,
                 got: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.inputs = inputs
        self.expected = expected
        self.got = got


class LoadError(Exception):
    """The learner's file could not be imported (syntax error, import error, ...)."""


class CaseTimeout(Exception):
    """A case ran longer than its time limit (an endless loop in the learner's code?)."""


def expect(condition: bool, message: str, *, inputs: Any = None, expected: Any = None,
           got: Any = None) -> None:
    """Raise ``CaseFailure`` unless ``condition`` holds (the grader's only assertion)."""
    if not condition:
        raise CaseFailure(message, inputs=inputs, expected=expected, got=got)


@dataclass
class Case:
    name: str
    run: Callable[[ModuleType], None]


@dataclass
class Exercise:
    """One exercise: its file name (without .py), title, the functions to write, hidden cases."""

    name: str                      # e.g. "06_paged_gather": exercises/06_paged_gather.py
    title: str
    functions: tuple[str, ...]     # names the learner's module must define
    hint: str
    cases: list[Case] = field(default_factory=list)

    @property
    def number(self) -> int:
        return int(self.name.split("_", 1)[0])

    def case(self, name: str) -> Callable[[Callable[[ModuleType], None]], Callable]:
        """Decorator: register a hidden case under a human-readable name."""
        def deco(fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
            self.cases.append(Case(name, fn))
            return fn
        return deco


@dataclass
class CaseResult:
    name: str
    status: str                    # "pass" | "fail" | "todo" | "error" | "timeout"
    detail: str = ""
    failure: CaseFailure | None = None
    where: str = ""                # learner file location of an exception, "file:line: code"


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
EXERCISE_MARK = re.compile(r'^EXERCISE\s*=\s*["\'](\d\d_[A-Za-z0-9_]+)["\']', re.MULTILINE)


def exercise_name_in(path: Path) -> str | None:
    """The ``EXERCISE = "NN_name"`` marker of a file (a copy under any name keeps it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    m = EXERCISE_MARK.search(text)
    return m.group(1) if m else None


def load_module(path: Path) -> ModuleType:
    """Import a Python file from any path under a fresh module name, or raise ``LoadError``."""
    name = f"_minipaged_learner_{path.stem}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"{path} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module     # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise LoadError(f"syntax error in {path.name} line {e.lineno}: {e.msg}\n"
                        f"    {(e.text or '').rstrip()}") from None
    except Exception as e:  # noqa: BLE001 - anything the learner's top level raises
        sys.modules.pop(name, None)
        raise LoadError(f"importing {path.name} raised {type(e).__name__}: {e}"
                        f"{_learner_location(e, path)}") from None
    return module


def _learner_frames(exc: BaseException, path: Path) -> list[traceback.FrameSummary]:
    target = str(path.resolve())
    frames = traceback.extract_tb(exc.__traceback__)
    return [f for f in frames if str(Path(f.filename).resolve()) == target]


def _learner_location(exc: BaseException, path: Path) -> str:
    frames = _learner_frames(exc, path)
    if not frames:
        return ""
    f = frames[-1]
    return f"\n    at {path.name}:{f.lineno} in {f.name}(): {(f.line or '').strip()}"


def _with_timeout(fn: Callable[[], None], seconds: float) -> None:
    """Run ``fn``; raise ``CaseTimeout`` after ``seconds`` where SIGALRM exists (Unix, main thread).
    Elsewhere the case simply runs to completion."""
    usable = (hasattr(signal, "SIGALRM") and seconds > 0
              and threading.current_thread() is threading.main_thread())
    if not usable:
        fn()
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"stopped after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_case(case: Case, module: ModuleType, path: Path, timeout_s: float) -> CaseResult:
    try:
        _with_timeout(lambda: case.run(module), timeout_s)
    except NotImplementedError as e:
        frames = _learner_frames(e, path)
        func = frames[-1].name if frames else "?"
        return CaseResult(case.name, "todo", f"{func}() still raises NotImplementedError")
    except CaseFailure as e:
        return CaseResult(case.name, "fail", e.message, failure=e)
    except CaseTimeout as e:
        return CaseResult(case.name, "timeout", f"{e} (an endless loop?)")
    except Exception as e:  # noqa: BLE001 - the learner's code may raise anything
        msg = str(e).splitlines()[0][:300] if str(e) else ""
        return CaseResult(case.name, "error", f"{type(e).__name__}: {msg}",
                          where=_learner_location(e, path).strip())
    return CaseResult(case.name, "pass")


def grade(exercise: Exercise, path: Path, *, timeout_s: float = 20.0) -> GradeResult:
    """Import ``path`` and run every hidden case of ``exercise`` against it (each case stopped
    after ``timeout_s`` seconds where the platform allows; 0 = no limit)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not timeout_s >= 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be a number of seconds >= 0")
    path = Path(path)
    loaded: list[ModuleType] = []
    try:  # the import runs the file's top level: an endless loop there is stopped too
        _with_timeout(lambda: loaded.append(load_module(path)), timeout_s)
        module = loaded[0]
    except LoadError as e:
        return GradeResult(exercise, path, [], load_error=str(e))
    missing = [f for f in exercise.functions if not hasattr(module, f)]
    if missing:
        return GradeResult(exercise, path, [], load_error=(
            f"{path.name} does not define {', '.join(missing)}; is it exercise "
            f"{exercise.name}? (its EXERCISE marker or file name says so)"))
    results = [run_case(c, module, path, timeout_s) for c in exercise.cases]
    return GradeResult(exercise, path, results)


def expect_raises(call: Callable[[], Any], kinds: type | tuple[type, ...], message: str, *,
                  inputs: Any = None) -> None:
    """The learner's code must reject bad input with one of ``kinds`` (e.g. ValueError).

    NotImplementedError passes through, so an untouched function reads as "todo"."""
    try:
        value = call()
    except NotImplementedError:
        raise
    except kinds:
        return
    except Exception as e:  # noqa: BLE001 - a wrong exception type is a failure to report
        raise CaseFailure(message, inputs=inputs, expected=_names(kinds),
                          got=f"{type(e).__name__}: {e}") from None
    raise CaseFailure(message, inputs=inputs, expected=_names(kinds),
                      got=f"no exception; returned {value!r}")


def _names(kinds: type | tuple[type, ...]) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(k.__name__ for k in kinds) + " raised"
