"""Sequences and sequence groups: what the scheduler moves between its queues.

What this teaches: vLLM's vocabulary for requests. A *sequence* is one token stream; a
*sequence group* is one request (n parallel samples or k beams are n or k sequences sharing the
prompt, paper section 4.4), and all of its sequences are admitted, preempted and finished
together. A sequence's ``token_ids`` are the prompt plus every sampled token; ``num_computed``
of them have K/V in the cache. A *prefill chunk* is the token range of one sequence whose K/V a
step computes. Read next: ``scheduler.py``, which moves groups between its queues (waiting,
running, swapped, finished, rejected: the status strings below).
"""

from __future__ import annotations

WAITING, RUNNING, SWAPPED, FINISHED, REJECTED = "waiting", "running", "swapped", "finished", \
    "rejected"


def _order(g: SequenceGroup) -> int:
    return g.order


class Sequence:
    """One token stream of a request. ``prefilling``: its K/V are not all computed yet."""

    __slots__ = ("seq_id", "group", "token_ids", "num_computed", "prefilling", "stop_len")

    def __init__(self, seq_id: int, group: SequenceGroup, token_ids: list[int]) -> None:
        self.seq_id = seq_id
        self.group = group
        self.token_ids = token_ids
        self.stop_len = group.prompt_len + group.output_len  # finished at this many tokens
        self.num_computed = 0
        self.prefilling = True

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, len={len(self.token_ids)}, "
                f"computed={self.num_computed}, prefilling={self.prefilling})")


class SequenceGroup:
    """One request: its sequences (1, n samples or k beams) and its timeline."""

    __slots__ = ("request_id", "order", "arrival_s", "prompt_len", "output_len", "n",
                 "beam_width", "seqs", "status", "first_token_s", "finish_s", "num_preemptions",
                 "outputs")

    def __init__(self, request_id, order: int, arrival_s: float, prompt_len: int,
                 output_len: int, n: int, beam_width: int) -> None:
        self.request_id, self.order, self.arrival_s = request_id, order, arrival_s
        self.prompt_len, self.output_len = prompt_len, output_len
        self.n, self.beam_width = n, beam_width
        self.seqs: list[Sequence] = []
        self.status = WAITING
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_preemptions = 0
        self.outputs: list[list[int]] = []  # token streams of finished sequences

    @property
    def width(self) -> int:
        """Sequences the group will run at once (the admission check counts them all)."""
        return max(self.n, self.beam_width)

    @property
    def final_len(self) -> int:
        """Tokens with K/V when the request finishes: the last sampled token is never computed."""
        return self.prompt_len + self.output_len - 1

    def __repr__(self) -> str:
        return (f"SequenceGroup(request_id={self.request_id!r}, status={self.status}, "
                f"seqs={len(self.seqs)})")


class PrefillChunk:
    """Compute K/V of ``seq.token_ids[start:end]`` this step (the whole rest of the prompt, or a
    chunk of it); the model samples only when ``end`` reaches the end of the sequence."""

    __slots__ = ("seq", "start", "end")

    def __init__(self, seq: Sequence, start: int, end: int) -> None:
        self.seq, self.start, self.end = seq, start, end

    def __repr__(self) -> str:
        return f"PrefillChunk(seq={self.seq.seq_id}, [{self.start}, {self.end}))"
