"""The reference generator: one sequence at a time, each with its own contiguous KV cache.

What it teaches: the way a first implementation generates text, and the oracle the paged engine
is checked against. Each sequence owns arrays k_cache[layer] and v_cache[layer] of shape
[max_seq_len, Hkv, D], reserved in full up front (exactly the waste of the paper's Fig. 2:
most of those rows are never written). Prefill writes the prompt's K/V in rows 0..P-1 and runs
causal attention over them; each decode step writes one row and attends over rows 0..pos.
Parallel samples and beams get private copies of the cache: no sharing at all.

Attention is either ``"dense"`` (minipaged.attention.dense_attention, NumPy, the same arithmetic
the paged "gather" path reproduces bit for bit) or ``"torch"`` (a plain softmax in torch, used by
the training script so that it depends on nothing else in the package).

Read next: engine.py, the paged engine that must produce the same tokens.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from minipaged._checks import check_choice
from minipaged.model.decoder import Decoder, scale_for
from minipaged.model.sampling import (
    Beam,
    CompletionOutput,
    RequestOutput,
    SamplingParams,
    apply_stop,
    beam_step,
    best_hypotheses,
    check_return_logits,
    finish_reason,
    log_softmax,
    max_new_tokens,
    resolve_seed,
    sample_token,
)
from minipaged.model.tokenizer import check_tokenizer, encode_prompts

ATTENTIONS = ("dense", "torch")


def torch_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [Tk, Hkv, D] -> [T, H, D]; query t sees keys 0 .. Tk - T + t."""
    T, H, _ = q.shape
    Tk, Hkv, _ = k.shape
    k = k.repeat_interleave(H // Hkv, dim=1)                      # [Tk, H, D]
    v = v.repeat_interleave(H // Hkv, dim=1)
    scores = torch.einsum("thd,khd->htk", q, k) * scale          # [H, T, Tk]
    allowed = torch.arange(Tk)[None, :] <= (Tk - T + torch.arange(T))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("htk,khd->thd", torch.softmax(scores, dim=-1), v)


class ContiguousCache:
    """One sequence's K/V: per layer [max_seq_len, Hkv, D], rows 0 .. length-1 valid."""

    def __init__(self, model: Decoder, dtype):
        c = model.cfg
        shape = (c.max_seq_len, c.n_kv_heads, c.head_dim)
        self.k = [np.zeros(shape, dtype) for _ in range(c.n_layers)]
        self.v = [np.zeros(shape, dtype) for _ in range(c.n_layers)]
        self.length = 0


class ReferenceGenerator:
    def __init__(self, model: Decoder, *, attention: str = "dense", tokenizer=None):
        check_choice("attention", attention, ATTENTIONS)
        self.model = model
        self.attention = attention
        self.tokenizer = check_tokenizer(tokenizer)
        self.dtype = next(model.parameters()).detach().numpy().dtype
        self.scale = scale_for(model.cfg)
        if attention == "dense":
            from minipaged.attention import dense_attention
            self._dense = dense_attention

    def _forward(self, cache: ContiguousCache, tokens: list[int]) -> np.ndarray:
        """Run ``tokens`` (continuing the cached sequence) and return the last one's logits."""
        start, T = cache.length, len(tokens)
        end = start + T

        def attend(layer, q, k, v):
            cache.k[layer][start:end] = k.numpy()
            cache.v[layer][start:end] = v.numpy()
            if self.attention == "dense":
                out = self._dense(q.numpy(), cache.k[layer][:end], cache.v[layer][:end],
                                  scale=self.scale, causal=True)
                return torch.from_numpy(np.ascontiguousarray(out))
            return torch_causal_attention(q, torch.from_numpy(cache.k[layer][:end]),
                                          torch.from_numpy(cache.v[layer][:end]), self.scale)

        logits = self.model.forward_packed(torch.tensor(tokens), torch.arange(start, end),
                                           attend, logit_rows=torch.tensor([T - 1]))
        cache.length = end
        return logits[0].numpy()

    def generate(self, prompts, params: SamplingParams | None = None, *,
                 return_logits: bool = False) -> list[RequestOutput]:
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        check_return_logits(return_logits, params)
        prompts, encoded = encode_prompts(self.tokenizer, prompts, self.model.cfg.max_seq_len)
        seed = resolve_seed(params)
        results = []
        for rid, (prompt, ids) in enumerate(zip(prompts, encoded)):
            out = RequestOutput(rid, prompt, ids)
            if params.beam_width > 1:
                out.outputs = self._beam_search(ids, params)
            else:
                out.outputs = [self._sample(ids, params, seed, i, return_logits)
                               for i in range(params.n)]
            results.append(out)
        return results

    def _sample(self, ids, params, seed, index, return_logits) -> CompletionOutput:
        cache = ContiguousCache(self.model, self.dtype)
        logits = self._forward(cache, ids)
        out_len = max_new_tokens(params, len(ids), self.model.cfg.max_seq_len)
        out, seen, cum = [], [], 0.0
        while True:
            seen.append(logits)
            tok = sample_token(logits, params, seed, index, len(out))
            cum += float(log_softmax(logits)[tok])
            out.append(tok)
            reason = finish_reason(out, out_len, params, self.tokenizer)
            if reason is not None:
                break
            logits = self._forward(cache, [tok])
        text = apply_stop(self.tokenizer.decode(out), params.stop)[0]
        return CompletionOutput(index, text, out, cum, reason,
                                np.stack(seen) if return_logits else None)

    def _beam_search(self, ids, params) -> list[CompletionOutput]:
        k, eos = params.beam_width, self.tokenizer.eos_id
        live, caches = [Beam([], 0.0)], [ContiguousCache(self.model, self.dtype)]
        logits = [self._forward(caches[0], ids)]
        finished: list[tuple[Beam, str]] = []
        while True:
            survivors, done = beam_step(live, [log_softmax(lg) for lg in logits], k, eos)
            finished.extend((b, "stop") for b in done)
            live = [Beam(live[i].tokens + [t], s) for i, t, s in survivors]
            # No sharing: every survivor gets its own full copy of its parent's cache.
            caches = [copy.deepcopy(caches[i]) for i, _, _ in survivors]
            steps = len(live[0].tokens) if live else 0
            if len(finished) >= k or not live:
                break
            if steps >= max_new_tokens(params, len(ids), self.model.cfg.max_seq_len):
                finished.extend((b, "length") for b in live)
                break
            logits = [self._forward(c, [b.tokens[-1]]) for c, b in zip(caches, live)]
        return best_hypotheses(finished, k, self.tokenizer.decode)
