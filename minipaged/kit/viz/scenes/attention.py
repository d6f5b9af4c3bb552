"""Scene ``attention``: a decode query walking its block table; the output equals dense attention.

What it shows (vLLM section 4.1): two sequences' K/V scattered in a pool. A decode query of
sequence A visits A's logical blocks in order; each frame shows the physical block it reads, the
scores q·k/sqrt(D) of its keys, and the running maximum and sum an online softmax keeps. The
last frame compares, bit for bit, ``paged_attention`` (both methods) with ``dense_attention``
on the K/V A wrote, kept aside contiguously: paging changes where K/V live, never the result.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from minipaged.attention import dense_attention
from minipaged.kit.viz.scene import Event, Frame, Scene
from minipaged.kit.viz.scenes.common import VOCAB, PagedKV
from minipaged.kit.viz.style import HEADING_STYLE, NOTE_STYLE
from minipaged.paged.paged_attention import paged_attention
from minipaged.serving.swap import KVCacheManager

NUM_BLOCKS = 12
BLOCK_SIZE = 4
H, HKV, D = 2, 1, 4  # two query heads share one KV head (GQA)


class AttentionScene(Scene):
    name = "attention"
    title = "PagedAttention: a query walking its block table"
    summary = "a query reads K/V block by block; the output equals dense attention, bit for bit"

    def frames(self) -> Iterator[Frame]:
        rng = np.random.default_rng(self.seed)
        self.manager = m = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE)
        kv = PagedKV(m, rng, num_kv_heads=HKV, head_size=D)
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
        yield self.pool_frame(f"Sequence A has {n} tokens in blocks {table}, scattered between "
                              f"B's. Its decode query (H={H} heads sharing Hkv={HKV} KV head) "
                              f"reads them through the block table.", [])
        run_max, run_sum = np.full(H, -np.inf), np.zeros(H)
        for i, block in enumerate(table):
            filled = min(BLOCK_SIZE, n - i * BLOCK_SIZE)
            k = kv.key_cache[block, 0, :filled].astype(np.float64)  # [filled, D] of KV head 0
            scores = (q[0].astype(np.float64) @ k.T) / np.sqrt(D)  # [H, filled]
            new_max = np.maximum(run_max, scores.max(axis=1))
            run_sum = run_sum * np.exp(run_max - new_max) + np.exp(
                scores - new_max[:, None]).sum(axis=1)
            run_max = new_max
            grid = Table(box=None, padding=(0, 1), header_style=NOTE_STYLE)
            for col in ("position", "slot", *[f"score h{h}" for h in range(H)]):
                grid.add_column(col, justify="right" if col.startswith("score") else "left")
            for j in range(filled):
                grid.add_row(str(i * BLOCK_SIZE + j), f"{block}*{BLOCK_SIZE}+{j}",
                             *[f"{scores[h, j]:+.3f}" for h in range(H)])
            running = "   ".join(f"h{h}: max {run_max[h]:+.3f}, sum {run_sum[h]:.3f}"
                                 for h in range(H))
            first = block * BLOCK_SIZE
            yield self.pool_frame(
                f"Logical block {i} of A lives in physical block #{block}: the query reads its "
                f"{filled} keys there.",
                [Event("note", f"block_table[A][{i}] = {block}: keys at slots "
                               f"{first}..{first + filled - 1}")],
                Group(Text(f"logical block {i} -> physical block #{block}", HEADING_STYLE), grid,
                      Text(f"online softmax so far   {running}", NOTE_STYLE)),
                highlight=[block])
        args = (q, kv.key_cache, kv.value_cache, m.block_tables(["A"]),
                np.array([n], dtype=np.int32))
        gather = paged_attention(*args, method="gather")
        online = paged_attention(*args, method="online")
        wk, wv = kv.written["A"]  # the contiguous K/V A wrote: [T, Hkv, D]
        dense = dense_attention(q, wk, wv)
        dense_tiled = dense_attention(q, wk, wv, tile=BLOCK_SIZE)
        out = Table(box=None, padding=(0, 1), header_style=NOTE_STYLE)
        out.add_column("output of head 0")
        out.add_column("values (first 4 of D)")
        for name, o in (("paged, gather", gather), ("dense", dense), ("paged, online", online),
                        ("dense, tile=BS", dense_tiled)):
            out.add_row(name, " ".join(f"{x:+.6f}" for x in o[0, 0, :4]))
        events = [Event("check", f"paged_attention(method='gather') == dense_attention, bit "
                                 f"for bit: {bool(np.array_equal(gather, dense))}"),
                  Event("check", f"paged_attention(method='online') == dense_attention(tile="
                                 f"{BLOCK_SIZE}), bit for bit: "
                                 f"{bool(np.array_equal(online, dense_tiled))}")]
        yield self.pool_frame("The result: paged attention over scattered blocks against dense "
                              "attention over one contiguous array.", events, out)
