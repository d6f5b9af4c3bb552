"""Sampling parameters, the outputs of a generate call, and the token-choosing rules.

What it teaches: how the next token is picked from logits, written once and shared by the paged
engine and the reference generator, so any difference between them can only come from the
cache. Sampling is made reproducible *per sample and per step*: the random number that picks
token ``t`` of sample ``i`` comes from a generator seeded with ``(seed, i, t)``, whatever else ran
in the batch, was preempted or shared blocks by copy-on-write. The logits it picks from are equal
to float32 rounding only (a batch packs rows differently; tests/engine_helpers.py's LOGIT_ATOL).

Beam search (vLLM v0 style): each step every live beam proposes candidates, the best
``2 * beam_width`` of all candidates by cumulative log-probability are taken in order; candidates
ending in <eos> become finished hypotheses, the first ``beam_width`` others stay live. It stops
when ``beam_width`` hypotheses have finished or after ``max_tokens`` steps (vLLM v0's
early_stopping=True; its default, False, also waits until no live beam scores above the worst of
them: _check_beam_search_early_stopping, vllm/engine/output_processor/single_step.py in v0);
hypotheses rank by cumulative log-probability over the number of tokens they generated (v0's
get_beam_search_score, vllm/sequence.py, divides by prompt + output length, less a final <eos>).
``beam_step`` below is the one implementation (its selection is sharing/sampling.select_beams,
lesson 04's too); the engine shares the survivors' blocks by fork, the reference copies caches.

Read next: reference.py, engine.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from minipaged._checks import check_bool, check_float, check_int, refuse_unused
from minipaged.sharing.sampling import Candidate, select_beams


@dataclass(frozen=True)
class SamplingParams:
    """What to generate for each prompt.

    max_tokens   new tokens at most per completion (>= 1)
    temperature  0 means greedy (argmax); > 0 samples from softmax(logits / temperature)
    top_k        0 keeps the whole vocabulary; k > 0 samples among the k most likely tokens
    n            completions per prompt (parallel sampling; they share the prompt's blocks)
    beam_width   > 1 runs beam search and returns that many beams (needs n == 1, temperature 0)
    seed         makes sampling reproducible; None draws one seed per generate call
    stop         strings that end a completion (not included in its text)
    ignore_eos   go on past end-of-sequence tokens (fixed output lengths, as vLLM's switch)

    Refused: what the decoding would not read or would repeat (top_k, seed and n > 1 under
    greedy decoding; under beam search top_k, seed, a temperature, stop and ignore_eos).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    n: int = 1
    beam_width: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        for name, low in (("max_tokens", 1), ("top_k", 0), ("n", 1), ("beam_width", 1)):
            check_int(name, getattr(self, name), low=low)
        ignore_eos = check_bool("ignore_eos", self.ignore_eos)
        t = check_float("temperature", self.temperature, low=0)
        seed = None if self.seed is None else check_int("seed", self.seed, low=0)
        object.__setattr__(self, "stop", _check_stop(self.stop))
        if self.beam_width > 1 and self.n != 1:
            raise ValueError(f"SamplingParams: beam search returns beam_width={self.beam_width} "
                             f"beams; n must be 1, got n={self.n}")
        # What the chosen decoding would not read, in the command line's words (its flags are
        # these names: kit/cli/generation_checks.py rewords this refusal with common.flag_words)
        drawn = {"temperature": (t, 0), "top_k": (int(self.top_k), 0), "seed": (seed, None)}
        if self.beam_width > 1:
            _refuse_unused(f"beam_width={self.beam_width} runs beam search, which keeps the "
                           "likeliest beams and draws nothing at random", drawn,
                           "beam_width without them")
            _refuse_unused(f"beam_width={self.beam_width} runs beam search, whose hypotheses "
                           "end at <eos> or after max_tokens steps",
                           {"stop": (self.stop, ()), "ignore_eos": (ignore_eos, False)},
                           "beam_width without them")
        elif t == 0:
            if self.n > 1:  # as vLLM 0.32: _verify_greedy_sampling, vllm/sampling_params.py
                raise ValueError(f"n={self.n} samples under temperature=0 (greedy, the "
                                 "default) would be identical; expected a temperature above 0")
            _refuse_unused("temperature=0 (the default) decodes greedily, the likeliest token "
                           "at every step, and draws nothing at random",
                           {k: drawn[k] for k in ("top_k", "seed")},
                           "a temperature above 0 with them")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def num_seqs(self) -> int:
        """Sequences one request keeps alive: n samples or beam_width beams."""
        return self.beam_width if self.beam_width > 1 else self.n


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float
    finish_reason: str                      # "stop" (<eos> or a stop string) or "length"
    logits: np.ndarray | None = None        # [num generated, V] when asked for


@dataclass
class RequestOutput:
    request_id: int
    prompt: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    first_token_time: float | None = None   # time.perf_counter() when its first token came


def _refuse_unused(doing: str, options: dict[str, tuple[object, object]], expected: str
                   ) -> None:
    """Refuse the options (name -> (value, unset value)) given although they would not be used
    (``_checks.refuse_unused``: ``{doing}: name=value, ... would not be used; ...``)."""
    refuse_unused(doing, [f"{k}={v!r}" for k, (v, unset) in options.items() if v != unset],
                  expected)


def _check_stop(stop: object) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings: one string, or a sequence of them (None: none)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, (bytes, bytearray, Mapping)) or not isinstance(stop, Iterable):
        raise TypeError(f"stop={stop!r:.60} must be a string or a sequence of strings, got "
                        f"{type(stop).__name__}")
    stop = tuple(stop)
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise TypeError(f"stop[{i}]={s!r:.60} must be a string, got {type(s).__name__}")
        if not s:
            raise ValueError(f"stop[{i}]='' is empty; expected non-empty strings")
    return stop


def check_return_logits(return_logits: object, params: SamplingParams) -> bool:
    """generate's return_logits: a bool, refused with beam search (its completions have none)."""
    if check_bool("return_logits", return_logits) and params.beam_width > 1:
        refuse_unused(f"beam_width={params.beam_width} runs beam search, whose completions carry "
                      "no logits", ["return_logits=True"], "return_logits=False with beam_width")
    return bool(return_logits)


def resolve_seed(params: SamplingParams) -> int:
    if params.seed is not None:
        return int(params.seed)
    return int(np.random.SeedSequence().entropy % (2**63))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def sample_token(logits: np.ndarray, params: SamplingParams, seed: int, sample_index: int,
                 step: int) -> int:
    """The token for output position ``step`` of sample ``sample_index``; logits [V]."""
    if params.greedy:
        return int(np.argmax(logits))              # first maximum on ties
    # The largest logit is subtracted before dividing: it becomes 0 and the rest <= 0, so a tiny
    # temperature sends them to -inf (probability 0), the greedy choice, where logits / T would
    # overflow to inf and inf - inf is NaN. Elsewhere z can move in its last ulp only.
    z = np.asarray(logits, dtype=np.float64)
    with np.errstate(over="ignore"):
        z = (z - z.max()) / params.temperature
    if 0 < params.top_k < z.shape[0]:
        kth = np.sort(z)[-params.top_k]
        z = np.where(z >= kth, z, -np.inf)
    cdf = np.cumsum(np.exp(z))                     # the maximum is still 0: exp(z) <= 1
    u = np.random.default_rng([seed, sample_index, step]).random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), z.shape[0] - 1))


def apply_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """(text cut before the earliest stop string, whether one occurred)."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(cuts)], True) if cuts else (text, False)


@dataclass
class Beam:
    tokens: list[int]
    cum_logprob: float

    def score(self) -> float:
        return self.cum_logprob / max(1, len(self.tokens))


def beam_step(live: list[Beam], logprobs: list[np.ndarray], beam_width: int, eos_id: int
              ) -> tuple[list[Candidate], list[Beam]]:
    """One beam-search step: each live beam proposes its ``2 * beam_width`` likeliest tokens
    (vLLM v0 took the top 2 * beam_width over all beams at once: they are among these), and
    ``select_beams`` (sharing/sampling.py, lesson 04's BeamSearch's rule too) picks among them.

    live: the live beams; logprobs[i] [V] is beam i's next-token log-probabilities.
    Returns (survivors, finished): survivors are Candidates (parent index, token, cumulative
    logprob) for the next live beams, best first; finished are new hypotheses that ended with
    <eos>. Candidates are listed by parent index, then token id, so that ties are broken that
    way and every implementation agrees."""
    cands = [Candidate(i, int(t), beam.cum_logprob + float(lp[t]))
             for i, (beam, lp) in enumerate(zip(live, logprobs))
             for t in sorted(np.argsort(-lp, kind="stable")[: 2 * beam_width])]
    survivors, finished = select_beams(cands, beam_width, eos_id)
    return survivors, [Beam(live[c.parent].tokens + [c.token], c.score) for c in finished]


def best_hypotheses(finished: list[tuple[Beam, str]], beam_width: int, decode
                    ) -> list[CompletionOutput]:
    """A finished beam search's completions: its best ``beam_width`` (hypothesis, reason) pairs
    by length-normalised score (a stable sort: ties keep the order they finished in)."""
    ranked = sorted(finished, key=lambda br: -br[0].score())[:beam_width]
    return [CompletionOutput(i, decode(b.tokens), b.tokens, b.cum_logprob, reason)
            for i, (b, reason) in enumerate(ranked)]


def max_new_tokens(params: SamplingParams, prompt_len: int, max_seq_len: int) -> int:
    """New tokens a completion may get: max_tokens, fewer where the model's positions end."""
    return min(params.max_tokens, max_seq_len - prompt_len)


def finish_reason(out_tokens: list[int], out_len: int, params: SamplingParams,
                  tokenizer) -> str | None:
    """Why a sample ends after its newest token, or None to go on. Shared by both generators:
    an end-of-sequence id (any of ``tokenizer.eos_ids``, unless ignore_eos) or a stop string
    -> "stop"; ``out_len`` tokens (``max_new_tokens``) -> "length"."""
    if out_tokens[-1] in tokenizer.eos_ids and not params.ignore_eos:
        return "stop"
    if params.stop and apply_stop(tokenizer.decode(out_tokens), params.stop)[1]:
        return "stop"
    if len(out_tokens) >= out_len:
        return "length"
    return None
