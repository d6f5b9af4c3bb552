"""The model runner: paged K/V arrays per layer, and one packed forward pass per step.

What it teaches: vLLM's *worker* side. The block manager (../serving/swap.py) decides which physical
block holds which token; the runner owns the arrays those block ids index, one pair per layer,

    key_caches[layer], value_caches[layer]: [NB, Hkv, BS, D]   (one block table for all layers)

and turns a step's work into one forward pass over all scheduled tokens packed together. At every
layer the new tokens' keys and values are scattered to their slots with
``cache_ops.reshape_and_cache``; then decode tokens (one per sequence) attend through
``paged_attention`` and prefill chunks through ``paged_prefill_attention``, both reading K/V only
through block tables. The NumPy views of torch tensors share memory (``Tensor.numpy()`` and
``torch.from_numpy`` copy nothing), so the model's activations reach the NumPy kernels as they are.
With backend="cupy" the same happens on a GPU: the model, the K/V pages and every step's
metadata are torch CUDA tensors, handed to the CUDA kernels through DLPack (no copy either).

Data movement before the forward pass, in this order (the scheduler's contract): swap-outs
(GPU -> CPU pool), swap-ins (CPU pool -> GPU), copy-on-write copies (``copy_blocks``), then the
step's new K/V. A swap-out must read its blocks before a swap-in or a copy may reuse them.

Shapes: T packed tokens, S sequences, H query heads, Hkv KV heads, D head size, NB blocks,
BS block size, MB max blocks per sequence, V vocabulary.

Read before: decoder.py, ../paged/cache_ops.py, ../paged/paged_attention.py. Read next: engine.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minipaged._checks import check_choice
from minipaged._install import GPU_HINT
from minipaged.model.decoder import Decoder, scale_for
from minipaged.paged.block_manager import pad_tables
from minipaged.paged.cache_ops import copy_blocks, reshape_and_cache

# "numpy": minipaged.paged.cache_ops and minipaged.paged.paged_attention (the default).
# "cuda-cpu": the CUDA kernels of minipaged/cuda (reshape_and_cache, copy_blocks and the decode
#     kernel) run on the CPU under the emulation harness; same K/V arrays, same block tables.
#     The decode kernel also serves prefill: query row t of a chunk starting at position p is a
#     "decode" of a sequence of length p + t + 1 over the same block table, which is exactly the
#     causal mask. Needs a head size and block size the kernels were compiled for.
# "cupy": the same kernels and the same calls on a GPU. The model runs on the CUDA device (a
#     copy of it, unless it is there already), the pages are torch CUDA tensors, and the
#     launchers of minipaged.cuda (backend="cupy") see them through DLPack: zero copy, on
#     torch's current stream. Only the logits come back to the host, for sampling. Needs a
#     CUDA GPU that torch sees, and CuPy (``minipaged._install.GPU_EXTRA``).
BACKENDS = ("numpy", "cuda-cpu", "cupy")


class BackendUnavailableError(RuntimeError):
    """The selected backend needs something this machine lacks (a GPU, CuPy)."""


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


def _cuda_device() -> torch.device:
    """torch's current CUDA device, after checking that backend="cupy" can run here."""
    hint = ("; use backend='numpy' (the default) or backend='cuda-cpu' (the same CUDA kernels "
            "under their CPU emulation)")
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            "backend='cupy' runs the CUDA kernels on a GPU, but torch sees no CUDA device "
            f"(torch.cuda.is_available() is False; torch {torch.__version__})" + hint)
    try:
        import cupy  # noqa: F401 - only its presence is checked here
    except ImportError as e:
        raise BackendUnavailableError(
            "backend='cupy' launches the CUDA kernels through CuPy, which is not installed "
            f"({GPU_HINT})" + hint) from e
    return torch.device("cuda", torch.cuda.current_device())


class PagedRunner:
    def __init__(self, model: Decoder, num_blocks: int, block_size: int, *,
                 num_cpu_blocks: int = 0, backend: str = "numpy"):
        check_choice("backend", backend, BACKENDS)
        from minipaged.serving.swap import CPUBlockPool

        self.model, self.backend = model, backend
        c = model.cfg
        torch_dtype = next(model.parameters()).dtype
        self.dtype = torch.empty((), dtype=torch_dtype).numpy().dtype
        self.device = None            # a torch.device for backend="cupy"; None: host arrays
        if backend == "numpy":
            from minipaged.paged.paged_attention import paged_attention, paged_prefill_attention

            self._decode_attn, self._prefill_attn = paged_attention, paged_prefill_attention
            self._write, self._copy = reshape_and_cache, copy_blocks
        else:
            self._setup_cuda(block_size)
        shape = (num_blocks, c.n_kv_heads, block_size, c.head_dim)       # [NB, Hkv, BS, D]

        def zeros():
            if self.device is None:
                return np.zeros(shape, self.dtype)
            return torch.zeros(shape, dtype=torch_dtype, device=self.device)

        self.key_caches = [zeros() for _ in range(c.n_layers)]
        self.value_caches = [zeros() for _ in range(c.n_layers)]
        self.cpu_pools = [CPUBlockPool(num_cpu_blocks, c.n_kv_heads, block_size, c.head_dim,
                                       self.dtype) for _ in range(c.n_layers)] \
            if num_cpu_blocks else []
        self.scale = scale_for(c)
        self.num_blocks_copied = 0
        self.num_blocks_swapped = 0

    def _setup_cuda(self, block_size: int) -> None:
        from minipaged.cuda import launch
        from minipaged.cuda.kernels import BLOCK_SIZES, DTYPES, HEAD_SIZES

        c = self.model.cfg
        if c.head_dim not in HEAD_SIZES or block_size not in BLOCK_SIZES \
                or self.dtype.name not in DTYPES:
            raise ValueError(
                f"backend={self.backend!r} runs the CUDA kernels, compiled for head sizes "
                f"{HEAD_SIZES}, block sizes {BLOCK_SIZES} and dtypes {tuple(DTYPES)}; got "
                f"head_dim={c.head_dim}, block_size={block_size}, dtype={self.dtype.name}")
        kernels = "cpu"
        if self.backend == "cupy":
            self.device = _cuda_device()
            kernels = "cupy"
            if next(self.model.parameters()).device != self.device:
                # a copy on the GPU: the caller's model (and a reference generator using it)
                # stays where it is
                import copy

                self.model = copy.deepcopy(self.model).to(self.device)

        # version=None: the launcher chooses per call (minipaged/cuda/checks.py,
        # choose_version): the grouped kernels (one block per KV head) whenever the model has
        # fewer KV heads than query heads, single pass or partitioned by vLLM's rule
        def decode(q, kc, vc, bt, sl, *, scale):
            return launch.paged_attention(q, kc, vc, bt, sl, scale=scale, backend=kernels,
                                          version=None)

        def prefill(q, kc, vc, bt, sl, ql, *, scale):
            # host metadata (the GPU path passes NumPy here and moves the results over)
            rows = np.repeat(np.arange(len(ql)), ql)                     # row -> sequence
            starts = np.repeat(sl - ql, ql)                              # chunk start position
            offsets = np.arange(len(rows)) - np.repeat(np.cumsum(ql) - ql, ql)
            lens = (starts + offsets + 1).astype(np.int32)               # [T] causal lengths
            tables = np.ascontiguousarray(bt[rows])                      # [T, MB]
            if self.device is not None:
                tables, lens = self._to_device(tables), self._to_device(lens)
            else:
                q = np.ascontiguousarray(q)
            return launch.paged_attention(q, kc, vc, tables, lens, scale=scale,
                                          backend=kernels, version=None)

        self._decode_attn, self._prefill_attn = decode, prefill
        self._write = lambda k, v, kc, vc, slots: launch.reshape_and_cache(
            k, v, kc, vc, slots, backend=kernels)
        self._copy = lambda kc, vc, pairs: launch.copy_blocks(kc, vc, pairs, backend=kernels)

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    # ---- data movement ---------------------------------------------------------------------
    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        for pool, kc, vc in zip(self.cpu_pools, self.key_caches, self.value_caches):
            if self.device is None:
                pool.copy_out(kc, vc, mapping)
            elif mapping:
                # device -> host over PCIe: gather the blocks on the GPU, one copy per array
                gpu = torch.tensor([g for g, _ in mapping], device=self.device)
                cpu = [c for _, c in mapping]
                pool.key_cache[cpu] = kc[gpu].cpu().numpy()
                pool.value_cache[cpu] = vc[gpu].cpu().numpy()
        self.num_blocks_swapped += len(mapping)

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        for pool, kc, vc in zip(self.cpu_pools, self.key_caches, self.value_caches):
            if self.device is None:
                pool.copy_in(kc, vc, mapping)
            elif mapping:
                cpu = [c for c, _ in mapping]
                gpu = torch.tensor([g for _, g in mapping], device=self.device)
                kc[gpu] = torch.from_numpy(pool.key_cache[cpu]).to(self.device)
                vc[gpu] = torch.from_numpy(pool.value_cache[cpu]).to(self.device)
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
        dec = [w for w in work if len(w.tokens) == 1]
        pre = [w for w in work if len(w.tokens) != 1]
        items = dec + pre
        dev = self.device
        # host metadata -> where the pages live: nothing to do for the NumPy-side backends, one
        # small copy per step to the GPU for "cupy" (before the first layer, not per layer)
        put = (lambda a: a) if dev is None else self._to_device
        tokens = torch.tensor([t for w in items for t in w.tokens], dtype=torch.long,
                              device=dev)                                               # [T]
        positions = torch.tensor([p for w in items for p in range(w.start, w.seq_len)],
                                 device=dev)
        slots = put(np.concatenate([w.slots for w in items]).astype(np.int64))         # [T]
        nd = len(dec)
        if dec:
            bt_d = put(pad_tables([w.block_table for w in dec]))                        # [S, MB]
            sl_d = put(np.array([w.seq_len for w in dec], dtype=np.int32))              # [S]
        if pre:  # kept on the host: the prefill functions derive per-row metadata from them
            bt_p = pad_tables([w.block_table for w in pre])
            sl_p = np.array([w.seq_len for w in pre], dtype=np.int32)
            ql_p = np.array([len(w.tokens) for w in pre], dtype=np.int32)

        def attend(layer, q, k, v):
            kc, vc = self.key_caches[layer], self.value_caches[layer]           # q [T, H, D]
            if dev is None:   # NumPy views of the torch tensors: no copy
                q, k, v = q.numpy(), k.numpy(), v.numpy()
                out = np.empty_like(q)
            else:             # torch CUDA tensors, which the launchers take through DLPack
                q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
                out = torch.empty_like(q)
            # Write first: a token attends to itself, so its K/V must be in the page already.
            self._write(k, v, kc, vc, slots)
            if dec:
                out[:nd] = self._decode_attn(q[:nd], kc, vc, bt_d, sl_d, scale=self.scale)
            if pre:
                out[nd:] = self._prefill_attn(q[nd:], kc, vc, bt_p, sl_p, ql_p, scale=self.scale)
            return torch.from_numpy(out) if dev is None else out

        # The last row of each item that wants logits.
        ends = np.cumsum([len(w.tokens) for w in items]) - 1
        rows = [int(ends[j]) for j, w in enumerate(items) if w.want_logits]
        logits = self.model.forward_packed(tokens, positions, attend,
                                           logit_rows=torch.tensor(rows, dtype=torch.long,
                                                                   device=dev))
        rows = iter(logits.cpu().numpy())        # [rows, V]; on the host already but for "cupy"
        by_item = {id(w): next(rows) for w in items if w.want_logits}
        return [by_item[id(w)] for w in work if w.want_logits]
