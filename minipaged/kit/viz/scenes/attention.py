"""Scene ``attention``: a decode query walking its block table; the output equals dense attention.

What it shows (vLLM section 4.1, PagedAttention): two sequences' K/V live scattered in a pool of
blocks (written with ``reshape_and_cache``). One decode query of sequence A visits A's logical
blocks in order; each frame shows the physical block it reads and the scores q·k/sqrt(D) of the
keys in it, with the running maximum and sum that an online softmax keeps (the "online" method
reads one block at a time exactly like this). The last frame compares, bit for bit, the output of
``paged_attention`` (both methods) with ``dense_attention`` on the K/V the sequence wrote, kept
aside in one contiguous array: paging changes where K/V live, never what attention computes.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from minipaged.kit.viz.blocks import block_tables, memory_map
from minipaged.kit.viz.labels import Labels
from minipaged.kit.viz.palette import HEADING_STYLE, NOTE_STYLE
from minipaged.kit.viz.scene import Frame, Scene
from minipaged.kit.viz.scenes.common import VOCAB, PagedKV
from minipaged.kit.viz.state import read_pool
from minipaged.kit.viz.steplog import Event

NUM_BLOCKS = 12
BLOCK_SIZE = 4
H, HKV, D = 2, 1, 4  # two query heads share one KV head (GQA)


class AttentionScene(Scene):
    name = "attention"
    title = "PagedAttention: a query walking its block table"
    summary = "a query reads K/V block by block; the output equals dense attention, bit for bit"
    needs = ("core", "attention")

    def managers(self) -> dict[str, object]:
        return {"pool": self.manager}

    def frames(self) -> Iterator[Frame]:
        from minipaged.serving.swap import KVCacheManager

        # Looked up by name: these modules belong to the attention area and may land later.
        dense_attention = importlib.import_module("minipaged.attention").dense_attention
        paged_attention = importlib.import_module("minipaged.paged.paged_attention").paged_attention

        rng = np.random.default_rng(self.seed)
        self.manager = m = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE)
        self.kv = kv = PagedKV(m, rng, num_kv_heads=HKV, head_size=D)
        self.labels = Labels()
        # Interleave the two sequences' growth so that A's blocks end up scattered.
        lens = {"A": int(rng.integers(9, 18)), "B": int(rng.integers(5, 12))}
        for s in lens:
            self.labels.name(s, s)
            m.allocate(s, [int(rng.integers(0, len(VOCAB)))])
            kv.write(s, 0)
        # The seed decides which sequence grows at each step, and so where A's blocks land.
        while growing := [s for s, n in lens.items() if m.seq_len(s) < n]:
            s = growing[int(rng.integers(0, len(growing)))]
            m.append_slot(s, int(rng.integers(0, len(VOCAB))))
            kv.write(s, m.seq_len(s) - 1)
        q = rng.standard_normal((1, H, D)).astype(np.float32)  # [S=1, H, D]: A's decode query
        table, n = m.block_table("A"), m.seq_len("A")
        scale = 1.0 / np.sqrt(D)
        yield self._frame(0, f"Sequence A has {n} tokens in blocks {table}, scattered between "
                             f"B's. Its decode query (H={H} heads sharing Hkv={HKV} KV head) "
                             f"reads them through the block table.", [], None)
        run_max = np.full(H, -np.inf)
        run_sum = np.zeros(H)
        for i, block in enumerate(table):
            filled = min(BLOCK_SIZE, n - i * BLOCK_SIZE)
            k = kv.key_cache[block, 0, :filled].astype(np.float64)  # [filled, D] of KV head 0
            scores = (q[0].astype(np.float64) @ k.T) * scale  # [H, filled]
            new_max = np.maximum(run_max, scores.max(axis=1))
            run_sum = run_sum * np.exp(run_max - new_max) + np.exp(
                scores - new_max[:, None]).sum(axis=1)
            run_max = new_max
            grid = Table(box=None, padding=(0, 1), header_style=NOTE_STYLE)
            grid.add_column("position")
            grid.add_column("slot")
            for h in range(H):
                grid.add_column(f"score h{h}", justify="right")
            for j in range(filled):
                pos = i * BLOCK_SIZE + j
                grid.add_row(str(pos), f"{block}*{BLOCK_SIZE}+{j}",
                             *[f"{scores[h, j]:+.3f}" for h in range(H)])
            running = "   ".join(f"h{h}: max {run_max[h]:+.3f}, sum {run_sum[h]:.3f}"
                                 for h in range(H))
            extra = Group(Text(f"logical block {i} -> physical block #{block}", HEADING_STYLE),
                          grid, Text(f"online softmax so far   {running}", NOTE_STYLE))
            first = block * BLOCK_SIZE
            yield self._frame(i + 1, f"Logical block {i} of A lives in physical block "
                                     f"#{block}: the query reads its {filled} keys there.",
                              [Event("note", f"block_table[A][{i}] = {block}: keys at slots "
                                             f"{first}..{first + filled - 1}")],
                              extra, highlight=[block])
        tables = m.block_tables(["A"])
        seq_lens = np.array([n], dtype=np.int32)
        gather = paged_attention(q, kv.key_cache, kv.value_cache, tables, seq_lens,
                                 method="gather")
        online = paged_attention(q, kv.key_cache, kv.value_cache, tables, seq_lens,
                                 method="online")
        wk, wv = kv.written["A"]  # the contiguous K/V A wrote: [T, Hkv, D]
        dense = dense_attention(q[0][None], wk, wv)
        dense_tiled = dense_attention(q[0][None], wk, wv, tile=BLOCK_SIZE)
        out = Table(box=None, padding=(0, 1), header_style=NOTE_STYLE)
        out.add_column("output of head 0")
        out.add_column("values (first 4 of D)")
        for name, o in (("paged, gather", gather[0, 0]), ("dense", dense[0, 0]),
                        ("paged, online", online[0, 0]), ("dense, tile=BS", dense_tiled[0, 0])):
            out.add_row(name, " ".join(f"{x:+.6f}" for x in o[:4]))
        same_g = bool(np.array_equal(gather[0], dense[0]))
        same_o = bool(np.array_equal(online[0], dense_tiled[0]))
        events = [Event("check", f"paged_attention(method='gather') == dense_attention, bit "
                                 f"for bit: {same_g}"),
                  Event("check", f"paged_attention(method='online') == dense_attention(tile="
                                 f"{BLOCK_SIZE}), bit for bit: {same_o}")]
        yield self._frame(len(table) + 1, "The result: paged attention over scattered blocks "
                                          "against dense attention over one contiguous array.",
                          events, out)

    def _frame(self, step: int, caption: str, events: list[Event], extra,
               highlight=()) -> Frame:
        view = read_pool(self.manager)
        parts = [block_tables(view, self.labels, width=self.width), Text(""),
                 memory_map(view, self.labels, width=self.width, highlight=highlight)]
        if extra is not None:
            parts += [Text(""), extra]
        return self.frame(step, caption, Group(*parts), events, pool=view)
