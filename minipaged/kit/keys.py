"""Single key presses from a terminal, for the demo, the quiz and the presenter.

Light on purpose (the standard library only): the presenter reads keys without importing the
quiz or rich. ``key_reader()`` reads keys without Enter while its block runs; ``wait_key`` asks
for one; ``decode_key`` names what a read brought.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def decode_key(raw: str) -> str:
    """What one key press means: "right" / "left" for the arrow keys (whose escape sequences
    ESC [ C / ESC [ D arrive together in one read, on Windows two characters ending in M / K),
    else the first character, lowercased; an empty read (end of input) means "q"."""
    if raw.startswith("\x1b[") or raw.startswith("\x1bO"):
        return {"C": "right", "D": "left"}.get(raw[2:3], "other")
    if raw[:1] in ("\x00", "\xe0"):
        return {"M": "right", "K": "left"}.get(raw[1:2], "other")
    return raw[:1].lower() if raw else "q"


@contextmanager
def key_reader() -> Iterator[Callable[[float | None], str | None]]:
    """Yields ``read(timeout)``: the next key as ``decode_key`` names it, or None when
    ``timeout`` seconds (None: no limit) pass without one. On Unix the terminal on stdin is in
    cbreak mode (keys arrive without Enter) until the block ends."""
    if os.name == "nt":  # pragma: no cover - exercised by hand on Windows
        yield _console_read
        return
    import select
    import termios
    import tty

    fd = sys.stdin.fileno()
    if not os.isatty(fd):  # a pipe or a file: termios would raise its own error, not OSError
        raise OSError(f"stdin (fd {fd}) is not a terminal")
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read(timeout: float | None) -> str | None:
        ready, _, _ = select.select([fd], [], [], timeout)
        # One raw read takes a whole escape sequence (an arrow key is three bytes), so its
        # tail is not left behind to be read as two more key presses.
        return decode_key(os.read(fd, 8).decode(errors="replace")) if ready else None

    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def wait_key(prompt: str) -> str:
    """One key press, as ``decode_key`` names it; where stdin is no terminal, the first
    character of a line."""
    sys.stdout.write(prompt)
    sys.stdout.flush()
    try:
        with key_reader() as read:
            key = read(None)
    except (ImportError, OSError, ValueError):
        key = decode_key((sys.stdin.readline() or "q")[:1])
    sys.stdout.write("\n")
    return key


def _console_read(timeout: float | None) -> str | None:  # pragma: no cover - Windows only
    import msvcrt

    end = None if timeout is None else time.monotonic() + timeout
    while end is None or time.monotonic() < end:
        if msvcrt.kbhit():
            ch = msvcrt.getwch()  # an arrow key is two characters, read together
            return decode_key(ch + msvcrt.getwch() if ch in ("\x00", "\xe0") else ch)
        time.sleep(0.02)
    return None
