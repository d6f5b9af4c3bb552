"""Scene ``model``: the tiny trained model generating real text through the paged engine.

Every other scene drives the managers by hand with made-up tokens; here the shipped checkpoint
(``minipaged/model``, a character-level model that counts down) is asked for two sampled
completions of one prompt, and the engine (``LLM.generate``) does everything itself: prefill,
a fork for the second sample (vLLM section 4.4), copy-on-write of the shared last block, new
blocks as samples grow, frees at the end. The scene only watches: ``LLM.on_step`` is called
after every engine step, reads the engine's own ``KVCacheManager`` and, when a block table
changed, pauses the engine (``generate`` runs in a worker thread that waits inside the callback)
until the frame has been shown, so a test can compare the frame with the live manager. A token
appears once its K/V is in the pool: the token sampled at one step is written at the next.
Needs torch (optional) and the checkpoint; without them ``missing()`` says so.
"""

from __future__ import annotations

import importlib.util
import queue
import threading
from collections.abc import Iterator

from rich.console import Group
from rich.table import Table
from rich.text import Text

from minipaged._install import TORCH_HINT
from minipaged.kit.viz.blocks import memory_map
from minipaged.kit.viz.scene import Event, Frame, Scene
from minipaged.kit.viz.scenes.common import blocks_text, ids_text
from minipaged.kit.viz.state import PoolView, read_pool
from minipaged.kit.viz.style import HEADING_STYLE, NOTE_STYLE

NUM_BLOCKS = 24  # 3 rows of the memory map; both samples fit without preemption
BLOCK_SIZE = 4   # small blocks: a countdown crosses a block boundary every 4 characters
N_SAMPLES = 2
TEMPERATURE = 1.0
MAX_TOKENS = 24  # enough for "count down from 9:" -> " 9 8 7 6 5 4 3 2 1 0." and <eos>


def token_texts() -> list[str]:
    """Token id -> how the picture shows it: the character, ``<bos>``/``<eos>`` for the special
    tokens, ``\\n`` and ``\\t`` escaped so that a row stays one line."""
    from minipaged.model.tokenizer import VOCAB_SIZE, CharTokenizer

    tok = CharTokenizer()
    return [{"\n": "\\n", "\t": "\\t"}.get(c, c)
            for c in (tok.decode([i], skip_special=False) for i in range(VOCAB_SIZE))]


def start_for(seed: int) -> int:
    """The countdown start the scene asks for: 9, 8, 7, 6 for seeds 0, 1, 2, 3, and so on."""
    return 9 - seed % 4


# What a frame's caption says for each kind of event in its step log, in this order.
SAID = {
    "admit": "the engine prefills \"{prompt}\" in one forward pass and samples its first "
             "character {n} times (n={n}, temperature {t:g}, seed {seed})",
    "fork": "the second sample is a fork of the first: it shares every prompt block (reference "
            "count 2)",
    "copy": "both write into the shared, partly filled last block: the first writer gets a copy "
            "(copy-on-write), the last writes in place; full prompt blocks stay shared",
    "block": "a last block filled up, so a new one came from the free list ({free} of {total} "
             "now free)",
    "preempt": "the pool ran short and a request was preempted",
    "free": "the samples ended (<eos> or max_tokens) and were freed; the pool has {free} of "
            "{total} blocks free again",
}


class _Stop(Exception):
    """Raised inside the engine's callback when nobody watches any more: unwinds ``generate``."""


class ModelScene(Scene):
    name = "model"
    title = "The tiny model: real text in the pages, two samples sharing them"
    summary = "the tiny trained model generates through the engine: n=2 samples share a prompt"
    log_title = "engine steps since the last picture"
    joiner = ""  # one token is one character

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return f"this scene runs the tiny model, which {TORCH_HINT}"
        from minipaged.model.checkpoint import DEFAULT_CHECKPOINT

        if not DEFAULT_CHECKPOINT.exists():
            return (f"the model checkpoint {DEFAULT_CHECKPOINT.name} is missing "
                    f"(python -m minipaged.model.train)")
        return None

    def managers(self) -> dict[str, object]:
        return {"pool": self.llm.manager}

    # ---- the watcher: runs inside LLM.on_step, in the engine's thread ------------------------
    def _observe(self, stats) -> Frame | None:
        """After every engine step: the frame to show, or None when the step changed no block
        table (tokens written in place only: the next frame's log lists them)."""
        view = read_pool(self.llm.manager, copies=stats.copies)
        def tables(v: PoolView) -> list:
            return [(t.seq_id, t.blocks) for t in v.tables]

        if self._shown is not None and tables(view) == tables(self._shown) and not (
                stats.copies or stats.preempted):
            return None
        events = self._events(self._shown, view, stats.preempted)
        frame = self._step_frame((self._since, stats.step), view, events)
        self._shown, self._since = view, stats.step + 1
        return frame

    def _events(self, old: PoolView | None, view: PoolView, preempted) -> list[Event]:
        """What changed between the last frame shown and now, read from the two views."""
        m = self.llm.manager
        before = {t.seq_id: t for t in old.tables} if old is not None else {}
        now = {t.seq_id: t for t in view.tables}
        events = []
        for t in view.tables:
            lab, o = self.labels(t.seq_id), before.get(t.seq_id)
            if o is None:
                self._order.append(t.seq_id)
                # A fork shares every block of a sequence listed before it; anything else new
                # was admitted (its prompt prefilled into blocks of its own).
                parent = next(p.seq_id for p in view.tables
                              if p.seq_id == t.seq_id or set(t.blocks) <= set(p.blocks))
                events.append(Event("fork", f"{lab} = fork of {self.labels(parent)} (sample "
                                            f"{self._order.index(t.seq_id)}): shares blocks "
                                            f"{blocks_text(t.blocks)}, nothing copied")
                              if parent != t.seq_id else
                              Event("admit", f"{lab}: prompt of {t.seq_len} tokens (with <bos>) "
                                             f"prefilled in one pass -> blocks "
                                             f"{blocks_text(t.blocks)}"))
                continue
            if t.seq_len > o.seq_len:
                text = "".join(self.vocab[i] for i in t.token_ids[o.seq_len:])
                slots = m.slot_mapping(t.seq_id, o.seq_len, t.seq_len)
                events.append(Event("append", f"{lab}: \"{text}\" ({len(text)} token"
                                              f"{'s' * (len(text) > 1)}) -> slots "
                                              f"{ids_text(slots, limit=8)}"))
            if len(t.blocks) > len(o.blocks):
                events.append(Event("block", f"{lab}: block {len(o.blocks) - 1} full, new "
                                             f"block #{t.blocks[-1]} from the free list"))
        for src, dst in view.copies:
            who = [self.labels(s) for s in now if s in before and before[s].blocks
                   and before[s].blocks[-1] == src and now[s].blocks[-1] == dst]
            events.append(Event("copy", f"#{src} -> #{dst}: {', '.join(who) or '?'} wrote into "
                                        f"a shared block, so it gets its own copy first"))
        events += [Event("preempt", f"request {rid} preempted by {mode}")
                   for rid, mode in preempted]
        events += [Event("free", f"{self.labels(s)} finished: its {len(before[s].blocks)} "
                                 f"blocks each lose a reference") for s in before if s not in now]
        return events

    # ---- the frames: the main thread --------------------------------------------------------
    def frames(self) -> Iterator[Frame]:
        from minipaged.model import LLM, SamplingParams
        from minipaged.model.checkpoint import load_model

        self.vocab = token_texts()
        self._shown: PoolView | None = None  # the view of the last frame shown
        self._since, self._order = 0, []  # first engine step not shown; seq_ids as they appeared
        self.llm = llm = LLM(load_model(), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
        self.prompt = f"count down from {start_for(self.seed)}:"
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, n=N_SAMPLES,
                                seed=self.seed)
        shown: queue.Queue = queue.Queue()
        go, stop = threading.Semaphore(0), threading.Event()

        def on_step(stats) -> None:
            frame = self._observe(stats)
            if frame is not None:
                shown.put(("step", frame))
                go.acquire()        # the engine waits here while the picture is on screen
                if stop.is_set():
                    raise _Stop

        def work() -> None:
            try:
                shown.put(("done", llm.generate([self.prompt], params)))
            except _Stop:
                pass
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                shown.put(("error", e))

        llm.on_step = on_step
        worker = threading.Thread(target=work, name="minipaged-model-scene", daemon=True)
        worker.start()
        try:
            while (item := shown.get())[0] == "step":
                yield item[1]
                go.release()
            if item[0] == "error":
                raise item[1]
            worker.join()
            yield self._completions_frame(item[1])
        finally:
            if worker.is_alive():  # closed early (q pressed): let the engine unwind
                stop.set()
                go.release()
                worker.join()

    def _step_frame(self, steps: tuple[int, int], view: PoolView,
                    events: list[Event]) -> Frame:
        lo, hi = steps
        kinds = {e.kind for e in events}
        facts = dict(prompt=self.prompt, n=N_SAMPLES, t=TEMPERATURE, seed=self.seed,
                     free=view.num_free, total=view.num_blocks)
        said = [text.format(**facts) for kind, text in SAID.items() if kind in kinds]
        when = f"Engine step {hi}" if lo == hi else f"Engine steps {lo}-{hi}"
        return self.pool_frame(f"{when}: " + "; ".join(said) + ".", events, view=view)

    def _completions_frame(self, outputs) -> Frame:
        from minipaged.model.corpus import check

        view = read_pool(self.llm.manager)
        table = Table(box=None, padding=(0, 2), header_style=NOTE_STYLE)
        for col in ("sample", "completion", "tokens", "ended by", "right answer?"):
            table.add_column(col, no_wrap=col != "completion",
                             justify="right" if col == "tokens" else "left")
        events = []
        for o in outputs[0].outputs:
            ok = check(self.prompt, o.text)
            table.add_row(f"{o.index} ({self.labels(self._order[o.index])})", repr(o.text),
                          str(len(o.token_ids)), str(o.finish_reason), "yes" if ok else "no")
            events.append(Event("check", f"sample {o.index}: \"{self.prompt}\" -> {o.text!r}: "
                                         f"{'right' if ok else 'wrong'} (corpus.check)"))
        events.append(Event("free", f"pool after generate: {view.num_free} of "
                                    f"{view.num_blocks} blocks free"))
        body = Group(Text(f"completions of \"{self.prompt}\"", HEADING_STYLE), table, Text(""),
                     memory_map(view, self.labels, width=self.width))
        return self.frame(f"generate() returns the {len(outputs[0].outputs)} completions, "
                          f"decoded by the tokenizer; every block is back on the free list.",
                          body, events, pool=view)
