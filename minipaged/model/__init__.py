"""A tiny torch language model that generates through the paged KV cache, end to end.

Until this package, the cache holds random numbers; here a real decoder writes its keys and
values into the pages and reads them back, and text comes out that can be checked.

Read in this order:
    tokenizer.py   characters <-> token ids (any printable ASCII prompt has tokens)
    corpus.py      the procedural counting task the model is trained on, and its checker
    decoder.py     the transformer: RMSNorm, rotary positions, GQA, SwiGLU
    train.py       the seeded training script that made checkpoints/count.pt
    sampling.py    SamplingParams, greedy / seeded sampling, beam search steps
    reference.py   the plain generator with a contiguous per-sequence cache: the oracle
    runner.py      the paged K/V arrays per layer and one packed forward pass per step
    engine.py      LLM: the paged engine, driven by minipaged.serving.scheduler
    engine_samples.py, engine_beams.py   the engine's sampling, parallel samples, beam search
    hf.py, hf_tokenizer.py, pool.py   Hugging Face checkpoints; the pool from a KV budget

torch is imported by decoder.py, reference.py and runner.py (so by engine.py), and inside the
functions of checkpoint.py, hf.py and the training script, never by ``import minipaged.model``,
so the command line stays usable without torch.
"""

from __future__ import annotations

from minipaged.model.sampling import CompletionOutput, RequestOutput, SamplingParams

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "load_model"]


def __getattr__(name):
    if name == "LLM":
        from minipaged.model.engine import LLM
        return LLM
    if name == "load_model":
        from minipaged.model.checkpoint import load_model
        return load_model
    raise AttributeError(f"module 'minipaged.model' has no attribute {name!r}")
