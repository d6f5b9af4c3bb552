"""The README's "Real models" table, computed: each row from the model's config.json sizes.

The four configs below are the sizes of each model's config.json on the Hugging Face Hub
(HuggingFaceTB/SmolLM2-135M, Qwen/Qwen2.5-0.5B, meta-llama/Llama-3.2-1B,
TinyLlama/TinyLlama-1.1B-Chat-v1.0). ``config_from_hf`` reads them as it reads a downloaded model,
the project's ``Decoder`` is built from them on the meta device (shapes, no memory), and its
parameter count, the checkpoint's size, the fp32 weights, the KV bytes per token and the tokens
per GiB must equal the README's row.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from minipaged.model.decoder import Decoder  # noqa: E402
from minipaged.model.hf import config_from_hf  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
LLAMA = ["LlamaForCausalLM"]
CONFIGS = {
    "SmolLM2-135M": dict(architectures=LLAMA, hidden_size=576, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192),
    "Qwen2.5-0.5B": dict(architectures=["Qwen2ForCausalLM"], hidden_size=896,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768),
    "Llama-3.2-1B": dict(architectures=LLAMA, hidden_size=2048, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
                         vocab_size=128256, tie_word_embeddings=True, head_dim=64,
                         max_position_embeddings=131072),
    "TinyLlama-1.1B": dict(architectures=LLAMA, hidden_size=2048, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, intermediate_size=5632,
                           vocab_size=32000, tie_word_embeddings=False,
                           max_position_embeddings=2048),
}


def readme_rows() -> dict[str, list[str]]:
    """The table's rows: model name -> its cells after the first."""
    rows = {}
    for line in README.read_text().splitlines():
        m = re.match(r"\| (\S+) \(`[^`]+`", line)
        if m and m.group(1) in CONFIGS:
            rows[m.group(1)] = [c.strip() for c in line.strip("|").split("|")[1:]]
    return rows


@pytest.mark.parametrize("name", CONFIGS)
def test_readme_row_is_computed_from_the_config(name, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[name]))
    cfg = config_from_hf(tmp_path)
    with torch.device("meta"):
        params = sum(p.numel() for p in Decoder(cfg).parameters())  # tied weights count once
    kv = cfg.kv_bytes_per_token(4)  # fp32
    want = [f"{params / 1e6:,.1f} M", f"{2 * params / 1e9:.2f} GB",
            f"{4 * params / 2**30:.2f} GiB", f"{kv:,} B", f"{2**30 // kv:,}"]
    assert readme_rows()[name] == want
