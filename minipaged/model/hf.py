"""Loading a Hugging Face checkpoint (Llama, Qwen2, Qwen3) into this package's own Decoder.

What it teaches: a checkpoint is a configuration and a dictionary of named matrices; nothing in
the paged cache changes for it, only the numbers grow (SmolLM2-135M: 30 layers, Hkv=3, D=64).
A model directory, as ``hf download`` leaves it: config.json, model.safetensors (or shards
listed by model.safetensors.index.json), tokenizer.json and tokenizer_config.json.

``config_from_hf`` maps config.json to a ModelConfig and refuses, by name, any setting the
Decoder lacks (sliding windows, other rotary scalings, biases beyond Qwen2's q/k/v). The
families differ only in switches of decoder.py (transformers: models/llama, models/qwen2,
models/qwen3, modeling_*.py). ``load_hf_model`` fills the Decoder by an explicit name map:
every checkpoint tensor lands in exactly one parameter of the same shape and every parameter
is filled, or the error names the tensors. Weights become float32 (checkpoints ship bfloat16).

Read before: decoder.py. Read next: hf_tokenizer.py, then engine.py (``LLM(model=DIR)``).
"""

from __future__ import annotations

import json
from pathlib import Path

SUPPORTED = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}

LAYER_MAP = {                   # layer i: our parameter name -> the checkpoint's
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.w_gate.weight": "mlp.gate_proj.weight",
    "mlp.w_up.weight": "mlp.up_proj.weight",
    "mlp.w_down.weight": "mlp.down_proj.weight",
}
QKV_BIAS_MAP = {"attn.wq.bias": "self_attn.q_proj.bias", "attn.wk.bias": "self_attn.k_proj.bias",
                "attn.wv.bias": "self_attn.v_proj.bias"}
QK_NORM_MAP = {"attn.q_norm.weight": "self_attn.q_norm.weight",
               "attn.k_norm.weight": "self_attn.k_norm.weight"}
# Buffers some older checkpoints saved: recomputed from the config, never loaded.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A model directory this loader cannot use; the message says what and where."""


def _rope(hf: dict) -> tuple[float, tuple | None]:
    """(theta, Llama 3 scaling tuple or None). transformers >= 5 writes one "rope_parameters"
    dict; older config.json files have "rope_theta" and "rope_scaling"."""
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise CheckpointError(f"rope scaling type {kind!r} is not implemented (only the default "
                              "rotary positions and Llama 3's 'llama3' scaling are)")
    return theta, (float(params["factor"]), float(params["low_freq_factor"]),
                   float(params["high_freq_factor"]),
                   int(params["original_max_position_embeddings"]))


def config_from_hf(model_dir: str | Path, *, max_seq_len: int | None = None):
    """The ModelConfig of a model directory's config.json; refuses, by name, what it lacks."""
    from minipaged.model.decoder import ModelConfig

    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{str(model_dir)!r} is not a model directory (no config.json); "
                                "fetch one with `hf download <repo> --local-dir DIR`")
    hf = json.loads(path.read_text())
    arch = (hf.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED:
        raise CheckpointError(f"architecture {arch!r} is not supported; this loader knows "
                              f"{sorted(SUPPORTED)}")
    family = SUPPORTED[arch]
    refuse = {"hidden_act": hf.get("hidden_act", "silu") not in ("silu", "swish"),
              "mlp_bias": bool(hf.get("mlp_bias")),
              "use_sliding_window": bool(hf.get("use_sliding_window")),
              "layer_types": any(t != "full_attention" for t in hf.get("layer_types") or []),
              # Llama and Qwen3: a bias on all four projections (Qwen2's q/k/v bias is built in)
              "attention_bias": family != "qwen2" and bool(hf.get("attention_bias"))}
    for key, bad in refuse.items():
        if bad:
            raise CheckpointError(f"config.json: {key}={hf.get(key)!r} is not implemented by "
                                  f"the Decoder ({arch})")
    theta, scaling = _rope(hf)
    heads = int(hf["num_attention_heads"])
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]), dim=int(hf["hidden_size"]),
        n_layers=int(hf["num_hidden_layers"]), n_heads=heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or heads),
        hidden_dim=int(hf["intermediate_size"]),
        max_seq_len=int(max_seq_len or hf["max_position_embeddings"]),
        rope_theta=theta, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        head_size=int(hf.get("head_dim") or 0), qkv_bias=family == "qwen2",
        qk_norm=family == "qwen3", tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rope_scaling=scaling)


def weight_files(model_dir: str | Path) -> dict[str, Path]:
    """Checkpoint tensor name -> the .safetensors file that holds it (sharded or not)."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {name: d / f for name, f in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.exists():
                raise CheckpointError(f"{index.name} lists shard {f.name!r}, which is missing")
        return files
    single = d / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"{str(d)!r} has neither model.safetensors nor "
                              "model.safetensors.index.json (only safetensors are read)")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 - safe_open is not a dict


def name_map(cfg) -> dict[str, str]:
    """Every Decoder parameter -> the checkpoint tensor that fills it."""
    names = {"tok_emb.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    per_layer = dict(LAYER_MAP)
    per_layer.update(QKV_BIAS_MAP if cfg.qkv_bias else {})
    per_layer.update(QK_NORM_MAP if cfg.qk_norm else {})
    for i in range(cfg.n_layers):
        for ours, theirs in per_layer.items():
            names[f"layers.{i}.{ours}"] = f"model.layers.{i}.{theirs}"
    return names


def load_hf_model(model_dir: str | Path, *, max_seq_len: int | None = None):
    """The Decoder of a Hugging Face model directory, float32, eval mode, on the CPU."""
    import torch
    from safetensors import safe_open

    from minipaged.model.decoder import Decoder

    cfg = config_from_hf(model_dir, max_seq_len=max_seq_len)
    files = weight_files(model_dir)
    wanted = name_map(cfg)                                   # ours -> theirs
    have = {n for n in files if not n.endswith(IGNORED_SUFFIXES)}
    missing = sorted(set(wanted.values()) - have)
    unexpected = sorted(have - set(wanted.values()))   # with tied embeddings: lm_head.weight
    for what, names in (("missing", missing), ("unexpected", unexpected)):
        if names:
            more = f" and {len(names) - 8} more" if len(names) > 8 else ""
            raise CheckpointError(f"{what} tensors in {str(model_dir)!r}: "
                                  f"{', '.join(names[:8])}{more}")
    model = Decoder(cfg)            # random init, overwritten below (a few seconds for 1B)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for path in sorted(set(files.values())):        # one shard open at a time
            with safe_open(str(path), framework="pt") as f:
                for ours in [o for o, theirs in wanted.items() if files[theirs] == path]:
                    t, p = f.get_tensor(wanted[ours]), params[ours]
                    if tuple(t.shape) != tuple(p.shape):
                        raise CheckpointError(f"tensor {wanted[ours]!r} has shape "
                                              f"{tuple(t.shape)}; config.json implies "
                                              f"{tuple(p.shape)} for {ours}")
                    p.copy_(t.to(torch.float32))
    return model.requires_grad_(False).eval()        # inference only


def load_hf(model_dir: str | Path, *, max_seq_len: int | None = None):
    """(Decoder, HFTokenizer) of a Hugging Face model directory."""
    from minipaged.model.hf_tokenizer import HFTokenizer

    model = load_hf_model(model_dir, max_seq_len=max_seq_len)
    return model, HFTokenizer(model_dir)
