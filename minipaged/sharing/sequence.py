"""Sequences and sequence groups: vLLM's vocabulary for requests, one model for every stage.

What this teaches: a *sequence* is one token stream (``token_ids``: the prompt plus every sampled
token, ``num_computed`` of them with K/V in the cache); a *sequence group* is one request: its n
samples or k beams share the prompt (paper section 4.4) and are admitted and preempted together
(section 4.5), each finishing on its own. A *prefill chunk* is the range whose K/V a step computes.
The lessons' helpers, the scheduler, the simulator and the engine all use these classes.

Read before: ``sharing/cow.py``. Read next: ``sharing/sampling.py``.
"""

from __future__ import annotations

from collections.abc import Hashable

WAITING, RUNNING, SWAPPED = "waiting", "running", "swapped"
FINISHED, REJECTED = "finished", "rejected"


class Sequence:
    """One token stream of a request. ``prefilling``: its K/V are not all computed yet."""

    __slots__ = ("seq_id", "group", "token_ids", "num_computed", "prefilling", "stop_len")

    def __init__(self, seq_id: Hashable, group: SequenceGroup, token_ids: list[int]) -> None:
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
                 "outputs", "next_index")

    def __init__(self, request_id, order: int = 0, arrival_s: float = 0.0, prompt_len: int = 0,
                 output_len: int = 0, n: int = 1, beam_width: int = 1) -> None:
        self.request_id, self.order, self.arrival_s = request_id, order, arrival_s
        self.prompt_len, self.output_len = prompt_len, output_len
        self.n, self.beam_width = n, beam_width
        self.seqs: list[Sequence] = []
        self.status = WAITING
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.num_preemptions = 0
        self.outputs: list[list[int]] = []  # token streams of finished sequences
        self.next_index = 0  # the i of the next ``(request_id, i)`` id the helpers hand out

    @property
    def seq_ids(self) -> list:
        """The ids of the live sequences, in order (a new list each time)."""
        return [s.seq_id for s in self.seqs]

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
