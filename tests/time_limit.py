"""A guard for the tests of runs that once hung: fail after a few seconds instead of hanging.

``with time_limit(30): ...`` raises TimeoutError inside the block when it runs longer (SIGALRM,
so the main thread on a POSIX system, which is where pytest runs tests). A guard, not a timed
assert: the limits are many times what the runs take, so only a hang trips them.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def time_limit(seconds: int):
    def on_alarm(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: this run used to hang")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
