"""Scene ``model``: the tiny trained model generating real text through the paged engine.

Every other scene drives the cache managers by hand with made-up tokens. This one runs the real
thing: the shipped checkpoint (``minipaged/model``, a character-level model that counts down) is
asked for two sampled completions of one prompt (``SamplingParams(n=2, temperature, seed)``), and
the engine (``LLM.generate``) does everything itself: it prefills the prompt, forks the second
sample from the first (vLLM section 4.4: they share the prompt's blocks), copies the shared,
partly filled last block on the first write (copy-on-write), allocates a block whenever a sample's
last one is full, and frees them all when the samples end. The scene only watches.

How it watches without scripting anything: ``LLM.on_step`` is called after every engine step. The
callback reads the engine's own ``KVCacheManager`` (``read_pool``) at that moment, writes down what
changed since the previous step (tokens written, blocks added, copies, forks, frees), and, at the
steps where the block tables changed, pauses the engine: ``generate`` runs in a worker thread that
waits inside the callback until the picture has been shown. So while a frame is on screen the
engine is stopped exactly at that step, and a test can compare the picture with the live manager
(``tests/test_demo_consistency.py``). Steps where only tokens were written in place are not
drawn; the next frame's log lists what they wrote.

Tokens are shown through the model's tokenizer, one character each, with ``|`` at block
boundaries. A token appears once its K/V is in the pool: the token sampled at a step is written at
the next one, when it is fed back in. The last frame prints the completions and checks them with
the corpus's own checker (``minipaged.model.corpus.check``).

Needs torch (an optional dependency) and the checkpoint; without them ``missing()`` says so and
the tour skips the scene. Read next: ``minipaged/model/engine.py``, lessons/09_*.py.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from minipaged.kit.viz.blocks import block_tables, memory_map
from minipaged.kit.viz.labels import Labels
from minipaged.kit.viz.palette import HEADING_STYLE, NOTE_STYLE
from minipaged.kit.viz.scene import Frame, Scene
from minipaged.kit.viz.scenes.common import blocks_text, ids_text
from minipaged.kit.viz.state import PoolView, read_pool
from minipaged.kit.viz.steplog import Event

NUM_BLOCKS = 24  # 3 rows of the memory map; both samples fit without preemption
BLOCK_SIZE = 4   # small blocks: a countdown crosses a block boundary every 4 characters
N_SAMPLES = 2
TEMPERATURE = 1.0
MAX_TOKENS = 24  # enough for "count down from 9:" -> " 9 8 7 6 5 4 3 2 1 0." and <eos>


def token_texts() -> list[str]:
    """Token id -> how the picture shows it: the character itself, ``<bos>``/``<eos>`` for the
    special tokens, ``\\n`` and ``\\t`` escaped so that a row stays one line."""
    from minipaged.model.tokenizer import VOCAB_SIZE, CharTokenizer

    tok = CharTokenizer()
    out = []
    for i in range(VOCAB_SIZE):
        ch = tok.decode([i], skip_special=False)
        out.append({"\n": "\\n", "\t": "\\t"}.get(ch, ch))
    return out


def start_for(seed: int) -> int:
    """The countdown start the scene asks for: 9, 8, 7, 6 for seeds 0, 1, 2, 3, and so on."""
    return 9 - seed % 4


@dataclass
class _Step:
    """One engine step as the callback saw it: the pool, what changed, and whether to draw it."""

    step: int
    view: PoolView
    events: list[Event] = field(default_factory=list)
    kinds: set[str] = field(default_factory=set)
    steps: tuple[int, int] = (0, 0)  # the engine steps this frame's log covers


class _Stop(Exception):
    """Raised inside the engine's callback when nobody watches any more: unwinds ``generate``."""


class ModelScene(Scene):
    name = "model"
    title = "The tiny model: real text in the pages, two samples sharing them"
    summary = "the tiny trained model generates through the engine: n=2 samples share a prompt"
    needs = ("core", "fork", "model")
    log_title = "engine steps since the last picture"

    def managers(self) -> dict[str, object]:
        return {"pool": self.llm.manager}

    # ---- the watcher: runs inside LLM.on_step, in the engine's thread -------------------------
    def _observe(self, stats) -> _Step | None:
        """Read the engine's manager after a step; return a _Step when it should be drawn."""
        m = self.llm.manager
        view = read_pool(m, copies=stats.copies)
        prev = self._prev
        old = {t.seq_id: t for t in prev.tables} if prev is not None else {}
        now = {t.seq_id: t for t in view.tables}
        ev, kinds = self._pending, self._kinds
        for t in view.tables:
            lab = self.labels(t.seq_id)
            if t.seq_id not in old:
                self._order.append(t.seq_id)
                # A fork shares every block of a sequence listed before it; anything else new
                # was admitted (its prompt prefilled into blocks of its own).
                parent = next((p.seq_id for p in view.tables if p.seq_id == t.seq_id or
                               set(t.blocks) <= set(p.blocks)), t.seq_id)
                if parent != t.seq_id:
                    ev.append(Event("fork", f"{lab} = fork of {self.labels(parent)} (sample "
                                            f"{self._order.index(t.seq_id)}): shares blocks "
                                            f"{blocks_text(t.blocks)}, nothing copied"))
                    kinds.add("fork")
                else:
                    ev.append(Event("admit", f"{lab}: prompt of {t.seq_len} tokens (with <bos>) "
                                             f"prefilled in one pass -> blocks "
                                             f"{blocks_text(t.blocks)}"))
                    kinds.add("admit")
                continue
            o = old[t.seq_id]
            if t.seq_len > o.seq_len:
                slots = m.slot_mapping(t.seq_id, o.seq_len, t.seq_len)
                self._written.setdefault(t.seq_id, []).extend(
                    (self._text[tid], int(s)) for tid, s in
                    zip(t.token_ids[o.seq_len:], slots))
            if len(t.blocks) > len(o.blocks):
                ev.append(Event("block", f"{lab}: block {len(o.blocks) - 1} full, new block "
                                         f"#{t.blocks[-1]} from the free list"))
                kinds.add("block")
        for src, dst in stats.copies:
            who = [self.labels(s) for s in now if s in old and old[s].blocks
                   and old[s].blocks[-1] == src and now[s].blocks[-1] == dst]
            ev.append(Event("copy", f"#{src} -> #{dst}: {', '.join(who) or '?'} wrote into a "
                                    f"shared block, so it gets its own copy first"))
            kinds.add("copy")
        for rid, mode in stats.preempted:
            ev.append(Event("preempt", f"request {rid} preempted by {mode}"))
            kinds.add("preempt")
        for s in old:
            if s not in now:
                ev.append(Event("free", f"{self.labels(s)} finished: its {len(old[s].blocks)} "
                                        f"blocks each lose a reference"))
                kinds.add("free")
        self._prev = view
        if not kinds:
            return None  # tokens written in place only: the next picture's log lists them
        out = _Step(stats.step, view, self._flush_written() + ev, set(kinds),
                    (self._since, stats.step))
        self._pending, self._kinds, self._since = [], set(), stats.step + 1
        return out

    def _flush_written(self) -> list[Event]:
        """One line per sample: the characters whose K/V was written, and the slots they went to."""
        out = []
        for s, items in self._written.items():
            text = "".join(ch for ch, _ in items)
            out.append(Event("append", f"{self.labels(s)}: \"{text}\" ({len(items)} token"
                                       f"{'s' if len(items) > 1 else ''}) -> slots "
                                       f"{ids_text([slot for _, slot in items], limit=8)}"))
        self._written = {}
        return out

    # ---- the frames: the main thread --------------------------------------------------------
    def frames(self) -> Iterator[Frame]:
        from minipaged.model import LLM, SamplingParams
        from minipaged.model.checkpoint import load_model

        self.labels = Labels()
        self._text = token_texts()
        self._prev: PoolView | None = None
        self._pending: list[Event] = []
        self._kinds: set[str] = set()
        self._written: dict[Hashable, list[tuple[str, int]]] = {}
        self._since = 0
        self._order: list[Hashable] = []  # seq_ids in order of first appearance
        self.llm = llm = LLM(load_model(), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
        self.prompt = prompt = f"count down from {start_for(self.seed)}:"
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, n=N_SAMPLES,
                                seed=self.seed)

        shown: queue.Queue = queue.Queue()
        go = threading.Semaphore(0)
        stop = threading.Event()

        def on_step(stats) -> None:
            step = self._observe(stats)
            if step is None:
                return
            shown.put(("step", step))
            go.acquire()        # the engine waits here while the picture is on screen
            if stop.is_set():
                raise _Stop

        def work() -> None:
            try:
                shown.put(("done", llm.generate([prompt], params)))
            except _Stop:
                pass
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                shown.put(("error", e))

        llm.on_step = on_step
        worker = threading.Thread(target=work, name="minipaged-model-scene", daemon=True)
        worker.start()
        n = 0
        try:
            while True:
                kind, payload = shown.get()
                if kind == "error":
                    raise payload
                if kind == "done":
                    break
                yield self._step_frame(n, payload)
                n += 1
                go.release()
            worker.join()
            yield self._completions_frame(n, payload)
        finally:
            if worker.is_alive():  # closed early (q pressed): let the engine unwind
                stop.set()
                go.release()
                worker.join()

    def _body(self, view: PoolView) -> RenderableType:
        parts: list[RenderableType] = [
            block_tables(view, self.labels, vocab=self._text, joiner="", width=self.width),
            Text(""), memory_map(view, self.labels, width=self.width)]
        if len(view.tables) > 1:
            distinct = len({b for t in view.tables for b in t.blocks})
            alone = sum(len(t.blocks) for t in view.tables)
            pct = 100 * (alone - distinct) / alone if alone else 0.0
            parts += [Text(""), Text(f"{len(view.tables)} samples hold {distinct} distinct blocks; "
                                     f"without sharing they would hold {alone}: {pct:.0f}% "
                                     f"saved", NOTE_STYLE)]
        return Group(*parts)

    def _step_frame(self, n: int, s: _Step) -> Frame:
        lo, hi = s.steps
        when = f"Engine step {hi}" if lo == hi else f"Engine steps {lo}-{hi}"
        said = []
        if "admit" in s.kinds:
            said.append(f"the engine prefills \"{self.prompt}\" in one forward pass and samples "
                        f"its first character {N_SAMPLES} times (n={N_SAMPLES}, temperature "
                        f"{TEMPERATURE:g}, seed {self.seed})")
        if "fork" in s.kinds:
            said.append("the second sample is a fork of the first: it shares every prompt block "
                        "(reference count 2)")
        if "copy" in s.kinds:
            said.append("both write into the shared, partly filled last block: the first writer "
                        "gets a copy (copy-on-write), the last writes in place; full prompt "
                        "blocks stay shared")
        if "block" in s.kinds:
            said.append(f"a last block filled up, so a new one came from the free list "
                        f"({s.view.num_free} of {s.view.num_blocks} now free)")
        if "preempt" in s.kinds:
            said.append("the pool ran short and a request was preempted")
        if "free" in s.kinds:
            said.append(f"the samples ended (<eos> or max_tokens) and were freed; the pool "
                        f"has {s.view.num_free} of {s.view.num_blocks} blocks free again")
        caption = f"{when}: " + "; ".join(said) + "."
        return self.frame(n, caption, self._body(s.view), s.events, pool=s.view)

    def _completions_frame(self, n: int, outputs) -> Frame:
        from minipaged.model.corpus import check

        view = read_pool(self.llm.manager)
        res = outputs[0]
        table = Table(box=None, padding=(0, 2), header_style=NOTE_STYLE)
        table.add_column("sample", no_wrap=True)
        table.add_column("completion")
        table.add_column("tokens", justify="right", no_wrap=True)
        table.add_column("ended by", no_wrap=True)
        table.add_column("right answer?", no_wrap=True)
        events = []
        for o in res.outputs:
            ok = check(self.prompt, o.text)
            label = f"{o.index} ({self.labels(self._order[o.index])})"
            table.add_row(label, repr(o.text), str(len(o.token_ids)), str(o.finish_reason),
                          "yes" if ok else "no")
            events.append(Event("check", f"sample {o.index}: \"{self.prompt}\" -> "
                                         f"{o.text!r}: {'right' if ok else 'wrong'} "
                                         f"(corpus.check)"))
        events.append(Event("free", f"pool after generate: {view.num_free} of "
                                    f"{view.num_blocks} blocks free"))
        body = Group(Text(f"completions of \"{self.prompt}\"", HEADING_STYLE), table, Text(""),
                     memory_map(view, self.labels, width=self.width))
        caption = (f"generate() returns the {len(res.outputs)} completions, decoded by the "
                   f"tokenizer; every block is back on the free list.")
        return self.frame(n, caption, body, events, pool=view)
