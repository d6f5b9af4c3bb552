"""Scenes and frames: how the demo is put together.

A ``Scene`` drives real managers (``KVCacheManager``, ``ContiguousKVCache`` ...) step by step and
yields a ``Frame`` after each step. A frame carries the picture (drawn from views read out of the
managers at that moment, ``viz/state.py``), the step log, and the views themselves, so a test can
stop at any frame and check that the picture matches the managers (``tests/test_demo*.py``).

A scene declares the manager features it needs (``needs``); ``available()`` probes for them, and
a scene whose features do not exist in this checkout is left out of the tour rather than faked.
The player (``minipaged/demo.py``) shows frames, waits for keys, and records them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.text import Text

from minipaged.kit.viz.palette import HEADING_STYLE, NOTE_STYLE
from minipaged.kit.viz.steplog import Event, step_log


@dataclass
class Frame:
    """One picture of a scene. ``views`` holds every view drawn in it, by name."""

    scene: str
    step: int
    caption: str  # one sentence a teacher could read aloud
    body: RenderableType
    events: list[Event] = field(default_factory=list)
    views: dict[str, object] = field(default_factory=dict)
    log_title: str = "this step"

    def renderable(self, *, index: int | None = None, total: int | None = None,
                   title: str = "") -> RenderableType:
        """The whole picture: a title rule with the frame counter, caption, body, step log."""
        step = "" if index is None else f"frame {index + 1}" + (f"/{total}" if total else "")
        head = Rule(Text.assemble((title or self.scene, HEADING_STYLE),
                                  f"  ·  {step}" if step else ""), align="left")
        return Group(head, Text(self.caption), Text(""), self.body, Text(""),
                     step_log(self.events, title=self.log_title))


def _probe_core() -> str | None:
    try:
        importlib.import_module("minipaged.serving.swap").KVCacheManager  # noqa: B018
    except (ImportError, AttributeError) as e:
        return f"the paged cache (KVCacheManager) is not there yet: {e}"
    return None


def _probe_contiguous() -> str | None:
    try:
        importlib.import_module("minipaged.contiguous.cache").ContiguousKVCache  # noqa: B018
    except (ImportError, AttributeError) as e:
        return f"the contiguous cache (minipaged.contiguous.ContiguousKVCache) is missing: {e}"
    return None


def _probe_attention() -> str | None:
    try:
        import numpy as np

        paged = importlib.import_module("minipaged.paged.paged_attention").paged_attention
        dense = importlib.import_module("minipaged.attention").dense_attention
        importlib.import_module("minipaged.paged.cache_ops").reshape_and_cache  # noqa: B018
        q = np.ones((1, 1, 2), np.float32)  # [S, H, D]
        cache = np.ones((1, 1, 2, 2), np.float32)  # [NB, Hkv, BS, D]
        paged(q, cache, cache, np.zeros((1, 1), np.int32), np.ones(1, np.int32))
        dense(q, cache[0, :, :1].transpose(1, 0, 2), cache[0, :, :1].transpose(1, 0, 2))
    except (ImportError, AttributeError, NotImplementedError) as e:
        return f"paged attention is not there yet: {e!r}"
    return None


def _probe_fork() -> str | None:
    if (msg := _probe_core()) is not None:
        return msg
    from minipaged.serving.swap import KVCacheManager

    try:
        m = KVCacheManager(4, 2)
        m.allocate(0, [1, 2, 3])
        m.fork(0, 1)
        m.append_slot(1, 4)
        m.take_copies()
    except (AttributeError, NotImplementedError) as e:
        return f"KVCacheManager.fork / take_copies do not work yet: {e!r}"
    return None


def _probe_prefix() -> str | None:
    if (msg := _probe_core()) is not None:
        return msg
    from minipaged.serving.swap import KVCacheManager

    try:
        m = KVCacheManager(8, 2, enable_prefix_caching=True)
        m.allocate(0, [1, 2, 3, 4, 5])
        m.free(0)
        hit = m.allocate(1, [1, 2, 3, 4, 6])
    except (TypeError, AttributeError, NotImplementedError) as e:
        return f"KVCacheManager(enable_prefix_caching=True) does not work yet: {e!r}"
    if hit != 4:
        return f"prefix caching reported {hit} cached tokens where 4 were expected"
    return None


def _probe_swap() -> str | None:
    if (msg := _probe_core()) is not None:
        return msg
    from minipaged.serving.swap import KVCacheManager

    try:
        m = KVCacheManager(8, 2, num_cpu_blocks=4)
        m.allocate(0, [1, 2, 3])
        m.swap_out([0])
        m.swap_in([0])
    except (TypeError, AttributeError, NotImplementedError) as e:
        return f"KVCacheManager.swap_out / swap_in do not work yet: {e!r}"
    return None


def _probe_model() -> str | None:
    """The tiny trained model and its paged engine: torch (an optional dependency) and the
    shipped checkpoint. torch is imported for real, so a broken install is reported here, not
    halfway through a scene."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install torch); this scene runs the tiny model"
    try:
        importlib.import_module("minipaged.model.engine").LLM  # noqa: B018
        ckpt = importlib.import_module("minipaged.model.checkpoint").DEFAULT_CHECKPOINT
    except (ImportError, AttributeError, OSError) as e:
        return f"the model engine (minipaged.model.engine.LLM) cannot be imported: {e!r}"
    if not ckpt.exists():
        return f"the model checkpoint {ckpt.name} is missing (python -m minipaged.model.train)"
    return None


PROBES: dict[str, Callable[[], str | None]] = {
    "core": _probe_core,
    "contiguous": _probe_contiguous,
    "attention": _probe_attention,
    "fork": _probe_fork,
    "prefix": _probe_prefix,
    "swap": _probe_swap,
    "model": _probe_model,
}


class Scene:
    """Base class: subclasses set ``name``, ``title``, ``summary``, ``needs`` and ``frames``."""

    name = ""
    title = ""
    summary = ""
    needs: tuple[str, ...] = ("core",)

    def __init__(self, *, seed: int = 0, width: int = 100) -> None:
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be an integer >= 0")
        if not isinstance(width, int) or width < 60:
            raise ValueError(f"width={width!r} must be an integer >= 60 (columns)")
        self.seed = seed
        self.width = width

    @classmethod
    def missing(cls) -> str | None:
        """Why this scene cannot run in this checkout, or None when it can."""
        for need in cls.needs:
            msg = PROBES[need]()
            if msg is not None:
                return msg
        return None

    def frames(self) -> Iterator[Frame]:
        raise NotImplementedError

    def managers(self) -> dict[str, object]:
        """The live managers, under the same names as the views drawn from them in each frame
        (so a test can pause at a frame and compare the two)."""
        raise NotImplementedError

    log_title = "this step"

    def frame(self, step: int, caption: str, body: RenderableType, events: list[Event],
              **views: object) -> Frame:
        return Frame(self.name, step, caption, body, list(events), dict(views), self.log_title)


def note(text: str) -> Text:
    return Text(text, NOTE_STYLE)
