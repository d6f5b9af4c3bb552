"""Block tables and slot mapping: the paged block manager (allocate / append_slot / free).

What this teaches (lesson 03; vLLM sections 4.2-4.3): token position p lives in logical block
p // BS at offset p % BS; the *block table* maps logical blocks to any physical blocks, and the
token's K/V go to slot ``block_table[p // BS] * BS + p % BS`` (the *slot mapping* that
``cache_ops.reshape_and_cache`` uses). A block is taken only when the last one is full, so a
sequence never holds more than BS - 1 unused slots. Nothing is shared yet: ``sharing/cow.py``,
``sharing/prefix_cache.py`` and ``serving/swap.py`` (``minipaged.KVCacheManager``) subclass it.

Invariants (tests/invariants.py asserts them after every step of the stateful tests):
    1. a live sequence of L tokens has exactly ceil(L / BS) entries in its block table;
    2. a block's reference count equals the table entries pointing at it (here 1 or 0);
    3. free blocks + blocks in use = NB, and freeing every sequence returns the pool to full;
    4. a call that raises (a bad argument, OutOfBlocksError) has changed nothing.

Read before: ``paged/block_allocator.py``. Read next: ``paged/cache_ops.py``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from minipaged._checks import (
    SIZE_LIMIT,
    cdiv,
    check_id_list,
    check_int,
    check_seq_id,
    check_token_ids,
)
from minipaged.contiguous.usage import KVUsage
from minipaged.paged.block_allocator import BlockAllocator

SeqId = Hashable


def pad_tables(tables: Sequence[Sequence[int]], pad: int = -1) -> np.ndarray:
    """int32 [S, MB] with MB the longest table; entries past a table's end are ``pad``."""
    pad = check_int("pad", pad, low=-SIZE_LIMIT, high=SIZE_LIMIT)  # an int32 entry
    mb = max((len(t) for t in tables), default=0)
    out = np.full((len(tables), mb), pad, dtype=np.int32)  # [S, MB]
    for i, t in enumerate(tables):
        out[i, :len(t)] = t
    return out


class BlockManager:
    """Which physical blocks hold which sequence's tokens. Block ids only: the caller owns the
    K/V arrays, as vLLM's workers own the cache tensors (vllm/worker/cache_engine.py in v0)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = check_int("block_size", block_size, low=1, high=SIZE_LIMIT)
        self.allocator = BlockAllocator(num_blocks)
        self._tables: dict[SeqId, list[int]] = {}  # seq -> physical block of each logical block
        self._tokens: dict[SeqId, list[int]] = {}  # seq -> its token ids so far

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    @property
    def seq_ids(self) -> list[SeqId]:
        return list(self._tokens)

    def ref_count(self, block: int) -> int:
        return self.allocator.ref_count(block)

    def seq_len(self, seq_id: SeqId) -> int:
        return len(self._token_list(seq_id))

    def token_ids(self, seq_id: SeqId) -> list[int]:
        return list(self._token_list(seq_id))

    def block_table(self, seq_id: SeqId) -> list[int]:
        return list(self._table(seq_id))

    def block_tables(self, seq_ids: Sequence[SeqId], pad: int = -1) -> np.ndarray:
        """These sequences' tables as one int32 [S, MB] array (``pad_tables``)."""
        return pad_tables([self._table(s) for s in check_id_list("seq_ids", seq_ids)], pad)

    def slot_mapping(self, seq_id: SeqId, start: int, end: int) -> np.ndarray:
        """int64 [end - start]: the cache slot of each token position in [start, end)."""
        table, n, bs = self._table(seq_id), self.seq_len(seq_id), self.block_size
        start = check_int("start", start, low=0, high=n + 1)
        end = check_int("end", end, low=start, high=n + 1)
        pos = np.arange(start, end, dtype=np.int64)
        return np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs

    def can_allocate(self, num_tokens: int) -> bool:
        """Room for a prompt of ``num_tokens`` (with prefix caching, hits only lower the need)."""
        n = check_int("num_tokens", num_tokens, low=1)
        return cdiv(n, self.block_size) <= self.num_free_blocks

    def _table(self, seq_id: SeqId) -> list[int]:
        """The sequence's block table itself (not a copy); an error if it has none."""
        try:
            return self._tables[seq_id]
        except KeyError:
            raise self._no_table_error(seq_id) from None
        except TypeError:  # unhashable: say which argument
            check_seq_id("seq_id", seq_id)
            raise

    def _no_table_error(self, seq_id: SeqId) -> Exception:
        return KeyError(f"seq_id={seq_id!r} is not allocated")

    def _token_list(self, seq_id: SeqId) -> list[int]:
        if check_seq_id("seq_id", seq_id) not in self._tokens:
            raise KeyError(f"seq_id={seq_id!r} is not allocated")
        return self._tokens[seq_id]

    def _check_new(self, name: str, seq_id: SeqId) -> SeqId:
        if check_seq_id(name, seq_id, new=True) in self._tokens:
            raise ValueError(f"{name}={seq_id!r} is already allocated")
        return seq_id

    # ---- allocate / append / free ----------------------------------------------------------
    def allocate(self, seq_id: SeqId, token_ids: Iterable[int]) -> int:
        """Blocks for a new prompt, all or nothing. Returns how many prompt tokens already have
        K/V (0 here; prefix caching returns its hits): the caller computes the rest."""
        seq_id = self._check_new("seq_id", seq_id)
        tokens = check_token_ids("token_ids", token_ids)
        need = cdiv(len(tokens), self.block_size)
        self._tables[seq_id] = self.allocator.allocate_many(
            need, f"for the prompt of seq_id={seq_id!r} ({len(tokens)} tokens)")
        self._tokens[seq_id] = tokens
        return 0

    def append_slot(self, seq_id: SeqId, token_id: int) -> int:
        """The cache slot of a new token at ``seq_len``; a new block only if the last is full."""
        table = self._table(seq_id)
        token_id = check_int("token_id", token_id, low=0)
        tokens = self._tokens[seq_id]
        offset = len(tokens) % self.block_size
        if offset == 0:  # the last block is full (or there is none): take a new one
            table.append(self.allocator.allocate())  # raises before anything changed
        else:
            self._before_write(table)
        tokens.append(token_id)
        return table[-1] * self.block_size + offset

    def _before_write(self, table: list[int]) -> None:
        """A token goes into the partly filled last block: ``sharing/cow.py`` copies if shared."""

    def rollback(self, seq_id: SeqId, n: int) -> None:
        """Undo the last ``n`` appends, 0 <= n < seq_len (rejected speculative tokens), once the
        step's K/V are written, like ``free``. Blocks left empty lose this user; the next
        ``append_slot`` overwrites the rolled-back slots (after copy-on-write if shared). vLLM
        v1 keeps the blocks and moves ``num_computed_tokens`` back instead
        (vllm/v1/core/sched/scheduler.py update_from_output)."""
        table, tokens = self._table(seq_id), self._tokens[seq_id]
        keep = len(tokens) - check_int("n", n, low=0, high=len(tokens))
        kept_blocks = cdiv(keep, self.block_size)
        dropped = table[kept_blocks:]
        del tokens[keep:], table[kept_blocks:]
        self._release(dropped)

    def free(self, seq_id: SeqId) -> None:
        """Release a sequence (finished or aborted): every block of it loses one user."""
        table = self._table(seq_id)
        del self._tables[seq_id], self._tokens[seq_id]
        self._release(table)

    def _release(self, table: list[int]) -> None:
        # Tail first: with prefix caching (``sharing/prefix_cache.py``) the tail is evicted first.
        self.allocator.release_blocks(reversed(table))

    # ---- accounting ------------------------------------------------------------------------
    def usage(self, final_lens: Mapping[SeqId, int] | None = None) -> KVUsage:
        """Slots by category (``contiguous/usage.py``) in O(#sequences); ``final_lens``: the
        length each sequence will reach (its unfilled slots up to there are *reserved*). Only a
        partly filled last block has empty slots, unless another table holds it as a full block
        (a sharer rolled back into it). Experiment 2 needs this shortcut: with the block-by-block
        count, ``usage_slow``, it took 9.7 s of its 10 s budget."""
        bs, final_lens = self.block_size, self._final_lens(final_lens)
        # last block -> (most filled, most wanted, tables holding it partly filled)
        partial: dict[int, tuple[int, int, int]] = {}
        for s, table in self._tables.items():
            n = len(self._tokens[s])
            if n % bs:
                final = int(final_lens.get(s, n))  # a NumPy int counts as a Python one
                f, w, k = partial.get(table[-1], (0, 0, 0))
                partial[table[-1]] = (max(f, n % bs), max(w, min(bs, final - n + n % bs)), k + 1)
        empty = [(f, w) for b, (f, w, k) in partial.items() if k == self._table_users(b)]
        in_tables = self.num_blocks - self.num_free_blocks - self._held_outside_tables()
        token = in_tables * bs - sum(bs - f for f, _ in empty)
        return self._usage(token, sum(w - f for f, w in empty))

    def usage_slow(self, final_lens: Mapping[SeqId, int] | None = None) -> KVUsage:
        """Oracle for ``usage``: the definition, block by block (a shared block counts once)."""
        bs, filled, wanted = self.block_size, {}, {}  # block -> most filled / most wanted
        final_lens = self._final_lens(final_lens)
        for s, table in self._tables.items():
            n = len(self._tokens[s])
            final = int(final_lens.get(s, n))
            for i, block in enumerate(table):
                filled[block] = max(filled.get(block, 0), min(bs, n - i * bs))
                wanted[block] = max(wanted.get(block, 0), min(bs, final - i * bs))
        return self._usage(sum(filled.values()), sum(wanted[b] - filled[b] for b in filled))

    def _final_lens(self, final_lens: object) -> Mapping[SeqId, int]:
        """``final_lens`` checked in O(#entries): live seq ids to ints >= their length."""
        if not isinstance(final_lens, Mapping | None):
            raise TypeError(f"final_lens must be a mapping of seq ids to final lengths, got "
                            f"{type(final_lens).__name__}")
        for s, f in (final_lens or {}).items():
            if s not in self._tokens:
                raise KeyError(f"final_lens names seq_id={s!r}, which is not allocated")
            if type(f) is not int or f < len(self._tokens[s]):
                check_int(f"final_lens[{s!r}]", f, low=len(self._tokens[s]))
        return final_lens or {}

    def _usage(self, token: int, reserved: int) -> KVUsage:
        bs, used = self.block_size, self.num_blocks - self.num_free_blocks
        return KVUsage(total=self.num_blocks * bs, token=token, reserved=reserved,
                       internal_fragmentation=used * bs - token - reserved,
                       external_fragmentation=0, free=self.num_free_blocks * bs)

    def _held_outside_tables(self) -> int:
        """Blocks in use that no table holds: none here (``sharing/cow.py`` has some)."""
        return 0

    def _table_users(self, block: int) -> int:
        """Table entries pointing at ``block`` (a valid id: no argument check): its count here."""
        return self.allocator._ref[block]
