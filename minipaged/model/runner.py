"""The model runner: paged K/V arrays per layer, and one packed forward pass per step.

What it teaches: vLLM's *worker* side. The block manager (kv_cache.py) decides which physical
block holds which token; the runner owns the arrays those block ids index, one pair per layer,

    key_caches[layer], value_caches[layer]: [NB, Hkv, BS, D]   (one block table for all layers)

and turns a step's work into one forward pass over all scheduled tokens packed together. At every
layer the new tokens' keys and values are scattered to their slots with
``cache_ops.reshape_and_cache``; then decode tokens (one per sequence) attend through
``paged_attention`` and prefill chunks through ``paged_prefill_attention``, both reading K/V only
through block tables. The NumPy views of torch tensors share memory (``Tensor.numpy()`` and
``torch.from_numpy`` copy nothing), so the model's activations reach the NumPy kernels as they are.

Data movement before the forward pass, in this order (the scheduler's contract): swap-outs
(GPU -> CPU pool), swap-ins (CPU pool -> GPU), copy-on-write copies (``copy_blocks``), then the
step's new K/V. A swap-out must read its blocks before a swap-in or a copy may reuse them.

Shapes: T packed tokens, S sequences, H query heads, Hkv KV heads, D head size, NB blocks,
BS block size, MB max blocks per sequence, V vocabulary.

Read before: decoder.py, ../kv_cache.py, ../paged_attention.py. Read next: engine.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minipaged.cache_ops import copy_blocks, reshape_and_cache
from minipaged.model.decoder import Decoder, scale_for

# "numpy": minipaged.cache_ops and minipaged.paged_attention (the default).
# "cuda-cpu": the CUDA kernels of minipaged/cuda (reshape_and_cache, copy_blocks and the decode
#     kernel) run on the CPU under the emulation harness; same K/V arrays, same block tables.
#     The decode kernel also serves prefill: query row t of a chunk starting at position p is a
#     "decode" of a sequence of length p + t + 1 over the same block table, which is exactly the
#     causal mask. Needs a head size and block size the kernels were compiled for.
BACKENDS = ("numpy", "cuda-cpu")


@dataclass
class SeqWork:
    """One sequence's share of a step: compute ``tokens`` at positions start .. start+len-1.

    slots int64 [len(tokens)] from KVCacheManager.slot_mapping; block_table the sequence's
    physical blocks; want_logits: sample after this step (a decode, or a prompt's last chunk)."""

    tokens: list[int]
    start: int
    slots: np.ndarray
    block_table: list[int]
    want_logits: bool = True

    @property
    def seq_len(self) -> int:
        return self.start + len(self.tokens)


def _pad_tables(tables: list[list[int]]) -> np.ndarray:
    mb = max(len(t) for t in tables)
    out = np.full((len(tables), mb), -1, dtype=np.int32)       # [S, MB]
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


class PagedRunner:
    def __init__(self, model: Decoder, num_blocks: int, block_size: int, *,
                 num_cpu_blocks: int = 0, backend: str = "numpy",
                 attention_method: str = "gather"):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        from minipaged.swap import CPUBlockPool

        self.model, self.backend, self.method = model, backend, attention_method
        c = model.cfg
        self.dtype = next(model.parameters()).detach().numpy().dtype
        if backend == "numpy":
            from minipaged.paged_attention import paged_attention, paged_prefill_attention

            self._decode_attn, self._prefill_attn = paged_attention, paged_prefill_attention
            self._write, self._copy = reshape_and_cache, copy_blocks
        else:
            self._setup_cuda(block_size)
        shape = (num_blocks, c.n_kv_heads, block_size, c.head_dim)       # [NB, Hkv, BS, D]
        self.key_caches = [np.zeros(shape, self.dtype) for _ in range(c.n_layers)]
        self.value_caches = [np.zeros(shape, self.dtype) for _ in range(c.n_layers)]
        self.cpu_pools = [CPUBlockPool(num_cpu_blocks, c.n_kv_heads, block_size, c.head_dim,
                                       self.dtype) for _ in range(c.n_layers)] \
            if num_cpu_blocks else []
        self.scale = scale_for(c)
        self.num_blocks_copied = 0
        self.num_blocks_swapped = 0

    def _setup_cuda(self, block_size: int) -> None:
        from minipaged.cuda import launch
        from minipaged.cuda.cpu_build import BLOCK_SIZES, DTYPES, HEAD_SIZES

        c = self.model.cfg
        if c.head_dim not in HEAD_SIZES or block_size not in BLOCK_SIZES \
                or self.dtype.name not in DTYPES:
            raise ValueError(
                f"backend={self.backend!r} runs the CUDA kernels, compiled for head sizes "
                f"{HEAD_SIZES}, block sizes {BLOCK_SIZES} and dtypes {tuple(DTYPES)}; got "
                f"head_dim={c.head_dim}, block_size={block_size}, dtype={self.dtype.name}")

        def decode(q, kc, vc, bt, sl, *, scale, method):
            return launch.paged_attention(q, kc, vc, bt, sl, scale=scale, backend="cpu")

        def prefill(q, kc, vc, bt, sl, ql, *, scale, method):
            rows = np.repeat(np.arange(len(ql)), ql)                     # row -> sequence
            starts = np.repeat(sl - ql, ql)                              # chunk start position
            offsets = np.arange(len(rows)) - np.repeat(np.cumsum(ql) - ql, ql)
            lens = (starts + offsets + 1).astype(np.int32)               # [T] causal lengths
            return launch.paged_attention(np.ascontiguousarray(q), kc, vc,
                                          np.ascontiguousarray(bt[rows]), lens, scale=scale,
                                          backend="cpu")

        self._decode_attn, self._prefill_attn = decode, prefill
        self._write = lambda k, v, kc, vc, slots: launch.reshape_and_cache(
            k, v, kc, vc, slots, backend="cpu")
        self._copy = lambda kc, vc, pairs: launch.copy_blocks(kc, vc, pairs, backend="cpu")

    @property
    def kv_bytes(self) -> int:
        return sum(a.nbytes for a in self.key_caches + self.value_caches)

    # ---- data movement ---------------------------------------------------------------------
    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        for pool, kc, vc in zip(self.cpu_pools, self.key_caches, self.value_caches):
            pool.copy_out(kc, vc, mapping)
        self.num_blocks_swapped += len(mapping)

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        for pool, kc, vc in zip(self.cpu_pools, self.key_caches, self.value_caches):
            pool.copy_in(kc, vc, mapping)
        self.num_blocks_swapped += len(mapping)

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: one copy_blocks call per layer for all of the step's pairs."""
        for kc, vc in zip(self.key_caches, self.value_caches):
            self._copy(kc, vc, pairs)
        self.num_blocks_copied += len(pairs)

    # ---- the forward pass ------------------------------------------------------------------
    def execute(self, work: list[SeqWork]) -> list[np.ndarray]:
        """Run every item's tokens in one packed pass; returns logits [V] for each item with
        ``want_logits``, in the order of ``work``."""
        if not work:
            return []
        # Decodes (one query token) go first in the packed batch, prefill chunks after, so
        # each attention kernel gets one contiguous range of rows.
        order = sorted(range(len(work)), key=lambda i: len(work[i].tokens) != 1)
        dec = [work[i] for i in order if len(work[i].tokens) == 1]
        pre = [work[i] for i in order if len(work[i].tokens) != 1]
        items = dec + pre
        tokens = torch.tensor([t for w in items for t in w.tokens], dtype=torch.long)   # [T]
        positions = torch.tensor([p for w in items for p in range(w.start, w.seq_len)])
        slots = np.concatenate([w.slots for w in items]).astype(np.int64)              # [T]
        nd = len(dec)
        if dec:
            bt_d = _pad_tables([w.block_table for w in dec])                            # [S, MB]
            sl_d = np.array([w.seq_len for w in dec], dtype=np.int32)                   # [S]
        if pre:
            bt_p = _pad_tables([w.block_table for w in pre])
            sl_p = np.array([w.seq_len for w in pre], dtype=np.int32)
            ql_p = np.array([len(w.tokens) for w in pre], dtype=np.int32)

        def attend(layer, q, k, v):
            kc, vc = self.key_caches[layer], self.value_caches[layer]
            # Write first: a token attends to itself, so its K/V must be in the page already.
            self._write(k.numpy(), v.numpy(), kc, vc, slots)
            qn = q.numpy()                                                              # [T, H, D]
            out = np.empty_like(qn)
            if dec:
                out[:nd] = self._decode_attn(qn[:nd], kc, vc, bt_d, sl_d, scale=self.scale,
                                             method=self.method)
            if pre:
                out[nd:] = self._prefill_attn(qn[nd:], kc, vc, bt_p, sl_p, ql_p,
                                              scale=self.scale, method=self.method)
            return torch.from_numpy(out)

        # The last row of each item that wants logits.
        ends = np.cumsum([len(w.tokens) for w in items]) - 1
        rows = [int(ends[j]) for j, w in enumerate(items) if w.want_logits]
        logits = self.model.forward_packed(tokens, positions, attend,
                                           logit_rows=torch.tensor(rows, dtype=torch.long))
        logits = logits.numpy()                                                # [rows, V]
        it = iter(logits)
        by_item = {id(w): next(it) for w in items if w.want_logits}
        return [by_item[id(w)] for w in work if w.want_logits]
