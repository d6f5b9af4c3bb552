"""Saving and loading the tiny model, and the shipped checkpoint.

The checkpoint is a torch file holding the model configuration, the weights in float16 (half
the bytes; the model computes in float32 or float64 after loading) and the settings of the
training run. Next to it, a JSON report carries the score the training script measured on
held-out prompts *after* reloading the float16 weights, so a test can re-measure it exactly.

Read next: train.py, which writes both files.
"""

from __future__ import annotations

import json
from pathlib import Path

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
DEFAULT_CHECKPOINT = CHECKPOINT_DIR / "count.pt"


def report_path(path: str | Path) -> Path:
    return Path(path).with_suffix(".json")


def save_checkpoint(model, path: str | Path, settings: dict) -> None:
    import torch

    state = {k: v.detach().to(torch.float16).clone() for k, v in model.state_dict().items()}
    torch.save({"config": model.cfg.as_dict(), "state_dict": state, "settings": settings},
               str(path))


def load_model(path: str | Path | None = None, *, dtype=None):
    """The Decoder stored at ``path`` (the shipped checkpoint by default), in eval mode."""
    import torch

    from minipaged.model.decoder import Decoder, ModelConfig

    path = Path(path) if path is not None else DEFAULT_CHECKPOINT
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist; train one with "
                                "`python -m minipaged.model.train`")
    blob = torch.load(str(path), map_location="cpu", weights_only=True)
    model = Decoder(ModelConfig(**blob["config"]))
    model.load_state_dict({k: v.float() for k, v in blob["state_dict"].items()})
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def read_report(path: str | Path | None = None) -> dict:
    """The training report next to the checkpoint (score on held-out prompts, settings)."""
    rp = report_path(path if path is not None else DEFAULT_CHECKPOINT)
    return json.loads(rp.read_text())
