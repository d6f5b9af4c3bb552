"""The ``train`` command: retrain the tiny counting model that ships with the package.

Its ``--help`` text, its parser (``add_train``, a flag for every ``TrainSettings`` field) and its
runner (``train``), which checks the settings before the minutes of training
(``minipaged/model/train.py`` trains).
"""

from __future__ import annotations

import os
from dataclasses import fields

from minipaged.kit.cli.args import NON_NEGATIVE, bounds, command, num, output_file, path
from minipaged.kit.cli.common import need_torch, refuse_if_too_big
from minipaged.model import train as training
from minipaged.model.checkpoint import DEFAULT_CHECKPOINT

TRAIN_HELP = """\
Train the tiny counting model that ships with the package (seeded; 5 to 15 minutes on one busy
CPU core) and write the checkpoint with a JSON report of its held-out score beside it. The
defaults are the settings of the shipped checkpoint (minipaged/model/train.py explains them).

examples:
  minipaged train                                        (rewrites the shipped checkpoint)
  minipaged train --steps 50 --warmup 5 --out /tmp/x.pt  (a quick smoke run)
"""
CPUS = os.cpu_count() or 1


def _seed(value: int) -> str | None:
    """torch takes seeds of 64 bits."""
    return None if 0 <= value < 2**64 else "must be >= 0 and < 2**64 (torch's seeds are 64-bit)"


def add_train(sub) -> None:
    d = training.TrainSettings()
    p = command(sub, "train", "train the tiny counting model (a few minutes of CPU)",
                TRAIN_HELP, train)
    num(p, "--seed", int, d.seed, "seed of the examples and the initial weights", _seed)
    num(p, "--steps", int, d.steps, "optimizer steps")
    num(p, "--batch-size", int, d.batch_size, "examples per step")
    num(p, "--lr", float, d.lr, "AdamW peak learning rate", bounds(above=0))
    num(p, "--warmup", int, d.warmup, "warm-up steps before the cosine decay (at most --steps)",
        NON_NEGATIVE)
    num(p, "--weight-decay", float, d.weight_decay, "AdamW weight decay", bounds(low=0))
    num(p, "--threads", int, d.threads, f"torch CPU threads (at most the {CPUS} CPUs here)",
        bounds(low=1, high=CPUS))
    num(p, "--num-eval", int, d.num_eval, f"held-out prompts scored after training (there are "
        f"{training.NUM_EVAL})", bounds(low=1, high=training.NUM_EVAL))
    path(p, "--out", output_file, "where to write the checkpoint (and its .json report)",
         default=str(DEFAULT_CHECKPOINT))


def train(args) -> int:
    from minipaged.sim import nbytes

    need_torch()
    training.check_warmup(args.warmup, args.steps, names=("--warmup", "--steps"))
    training.check_out(args.out, name="--out")
    report = str(training.report_path(args.out))   # written after the training: checked now
    if problem := output_file(report):
        raise ValueError(f"--out={args.out!r}: its report, {report!r}, {problem}")
    refuse_if_too_big(f"--batch-size={args.batch_size} (about "
                      f"{nbytes(training.BYTES_PER_EXAMPLE)} of activations per example)",
                      args.batch_size * training.BYTES_PER_EXAMPLE)
    settings = {f.name: getattr(args, f.name) for f in fields(training.TrainSettings)}
    training.train(training.TrainSettings(**settings), args.out)  # a flag for every setting
    return 0
