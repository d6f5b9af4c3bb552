"""Train the tiny counting model that ships with the package (seeded, a few minutes of CPU).

Run:  python -m minipaged.model.train            (writes checkpoints/count.pt and count.json)
      minipaged train --steps 50 --warmup 5 --out /tmp/x.pt   (other settings: a smoke run)

What it does: draws counting examples from corpus.py (held-out starts never included), trains
the decoder of decoder.py with AdamW on next-token cross-entropy over the *completion* tokens
only (the prompt is given, not predicted), then reloads the saved float16 weights and scores
greedy completions of held-out prompts with the reference generator. The score goes into the
JSON report beside the checkpoint; tests/test_model.py re-measures it.

Settings (the defaults are what made the shipped checkpoint; the report repeats them): seed 0,
torch threads 1, batch 32, 800 steps, AdamW lr 3e-3 (betas 0.9/0.98, weight decay 0.01), 100
warm-up steps then cosine decay to 10%, gradient clipping at 1.0. Model: ModelConfig defaults
(dim 64, 3 layers, 4 query heads, 2 KV heads, head size 16, SwiGLU hidden 176, 151K
parameters). Everything is seeded (Python's random for the data, torch for the weights), so a
rerun with the same torch version reproduces the run; another CPU may differ in the last bits
of float sums. On one busy laptop core it takes 5 to 15 minutes.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from minipaged._checks import check_int
from minipaged.model import corpus
from minipaged.model.checkpoint import DEFAULT_CHECKPOINT, load_model, report_path, save_checkpoint
from minipaged.model.tokenizer import EOS, PAD, CharTokenizer

NUM_EVAL = len(corpus.held_out_starts())      # every held-out prompt: 10
# Memory of one training step per example: a batch is padded to its longest row (191 tokens
# once it holds a count from 59), and the forward pass keeps every layer's activations for the
# backward pass. Measured here with /usr/bin/time (max RSS of 8 steps at batch 64 and 256):
# about 6 MB more per example; that is 190 MB at the default batch of 32.
BYTES_PER_EXAMPLE = 6_000_000


@dataclass
class TrainSettings:
    seed: int = 0
    steps: int = 800
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    threads: int = 1
    num_eval: int = NUM_EVAL


def make_batch(rng: random.Random, starts, batch_size: int, tok: CharTokenizer):
    import torch
    from torch.nn.utils.rnn import pad_sequence

    rows, masks = [], []
    for _ in range(batch_size):
        prompt, answer = corpus.sample_document(rng, starts)
        p = tok.encode(prompt)
        a = tok.encode(answer, bos=False) + [EOS]
        rows.append(torch.tensor(p + a))
        masks.append(torch.tensor([False] * len(p) + [True] * len(a)))
    x = pad_sequence(rows, batch_first=True, padding_value=PAD)       # [B, longest row]
    m = pad_sequence(masks, batch_first=True)                         # False on the padding
    # Predict token t+1 from tokens 0..t; the loss counts only completion targets.
    return x[:, :-1], x[:, 1:], m[:, 1:]


def check_num_eval(num: int) -> None:
    """There are NUM_EVAL held-out prompts: a score on more would be a score on fewer."""
    if check_int("num_eval", num, low=1) > NUM_EVAL:
        raise ValueError(f"num_eval={num} is more than the {NUM_EVAL} held-out prompts; "
                         f"expected <= {NUM_EVAL}")


def check_warmup(warmup: int, steps: int, names: tuple[str, str] = ("warmup", "steps")) -> None:
    """The learning rate climbs for ``warmup`` steps to its peak, then decays over the rest: a
    warm-up longer than the run would never reach the peak nor decay. ``names`` are what the
    caller calls the two settings (the command line: --warmup and --steps)."""
    if warmup > steps:
        w, n = names
        raise ValueError(f"{w}={warmup} is longer than {n}={steps}: the learning rate would "
                         f"never reach its peak nor decay; expected {w} <= {n}")


def check_out(out_path, name: str = "out_path") -> None:
    """The report is written beside the checkpoint with a .json suffix, so a checkpoint path
    ending in .json would be overwritten by its own report."""
    if report_path(out_path) == Path(out_path):
        raise ValueError(f"{name}={str(out_path)!r} ends in .json, the name its report is "
                         "written to; expected another suffix (.pt)")


def evaluate(model, num: int = NUM_EVAL, attention: str = "torch") -> float:
    """Fraction of ``num`` held-out counting prompts answered exactly right (greedy)."""
    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams

    check_num_eval(num)
    prompts = [corpus.prompt_for(n) for n in corpus.held_out_starts()[:num]]
    gen = ReferenceGenerator(model, attention=attention)
    outs = gen.generate(prompts, SamplingParams(max_tokens=200))
    return sum(corpus.check(o.prompt, o.outputs[0].text) for o in outs) / len(outs)


def train(s: TrainSettings, out_path, log=print) -> dict:
    import torch
    import torch.nn.functional as F

    from minipaged.model.decoder import Decoder, ModelConfig

    check_num_eval(s.num_eval)      # before the minutes of training, not after
    check_warmup(s.warmup, s.steps)
    check_out(out_path)
    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    rng = random.Random(s.seed)
    tok = CharTokenizer()
    starts = corpus.train_starts()
    model = Decoder(ModelConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.98),
                            weight_decay=s.weight_decay)
    t0 = time.perf_counter()
    for step in range(s.steps):
        frac = step / max(1, s.steps)
        lr = s.lr * (step + 1) / s.warmup if step < s.warmup else \
            s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y, m = make_batch(rng, starts, s.batch_size, tok)
        logits = model(x)
        loss = F.cross_entropy(logits[m], y[m])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == s.steps - 1:
            log(f"step {step:5d}  loss {loss.item():.4f}  lr {lr:.2e}  "
                f"{time.perf_counter() - t0:6.1f}s", flush=True)
    train_s = time.perf_counter() - t0
    save_checkpoint(model, out_path, asdict(s))
    reloaded = load_model(out_path)          # score what ships: the float16 weights
    score = evaluate(reloaded, s.num_eval)
    report = {"held_out_exact_match": score, "num_eval": s.num_eval, "final_loss": loss.item(),
              "train_seconds": round(train_s, 1), "parameters": model.num_parameters(),
              "torch_version": torch.__version__, "settings": asdict(s),
              "config": model.cfg.as_dict()}
    report_path(out_path).write_text(json.dumps(report, indent=2) + "\n")
    log(f"held-out exact match: {score:.3f} on {s.num_eval} prompts; wrote {out_path}")
    return report


if __name__ == "__main__":
    train(TrainSettings(), DEFAULT_CHECKPOINT)
