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
A file that is not what its name says (config.json not a JSON object, a size that is not a
positive int, a safetensors file with a broken header) is a CheckpointError naming the file and
the field.

Read before: decoder.py. Read next: hf_tokenizer.py, then engine.py (``LLM(model=DIR)``).
"""

from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager
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
# config.json's names for the ModelConfig sizes whose names differ (ModelConfig's errors say ours)
HF_NAMES = {"dim": "hidden_size", "n_layers": "num_hidden_layers",
            "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
            "hidden_dim": "intermediate_size", "max_seq_len": "max_position_embeddings"}


class CheckpointError(ValueError):
    """A model directory this loader cannot use; the message says what and where."""


def read_json(path: Path) -> dict:
    """The JSON object in ``path``, a file of a model directory; anything else is refused."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:   # not JSON, not UTF-8 text, nested too deep
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _size(hf: dict, key: str, where, default: int | None = None) -> int:
    """``hf[key]``, an int >= 1 (``default`` where it is absent or null)."""
    value = hf.get(key)
    if value is None and default is not None:
        return default
    if value is None:
        raise CheckpointError(f"{where}: {key} is missing; expected an int >= 1")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{where}: {key}={value!r} must be an int >= 1")
    return value


def _positive(hf: dict, key: str, where, default: float | None = None) -> float:
    """``hf[key]``, a finite number > 0 (``default`` where it is absent)."""
    value = hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise CheckpointError(f"{where}: {key}={value!r} must be a number > 0")
    return float(value)


def _rope(hf: dict, where) -> tuple[float, tuple | None]:
    """(theta, Llama 3 scaling tuple or None). transformers >= 5 writes one "rope_parameters"
    dict; older config.json files have "rope_theta" and "rope_scaling"."""
    params: dict = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = hf.get(key) or {}
        if not isinstance(value, dict):
            raise CheckpointError(f"{where}: {key}={value!r} must be an object (or null)")
        params.update(value)
    theta = _positive(params, "rope_theta", where, hf.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise CheckpointError(f"rope scaling type {kind!r} is not implemented (only the default "
                              "rotary positions and Llama 3's 'llama3' scaling are)")
    return theta, (*(_positive(params, k, where) for k in ("factor", "low_freq_factor",
                                                           "high_freq_factor")),
                   _size(params, "original_max_position_embeddings", where))


def config_from_hf(model_dir: str | Path, *, max_seq_len: int | None = None):
    """The ModelConfig of a model directory's config.json; refuses, by name, what it lacks.
    ``max_seq_len`` keeps fewer positions than config.json's, never more."""
    from minipaged.model.decoder import ModelConfig

    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{str(model_dir)!r} is not a model directory (no config.json); "
                                "fetch one with `hf download <repo> --local-dir DIR`")
    hf = read_json(path)
    archs = hf.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else archs
    if not isinstance(arch, str) or arch not in SUPPORTED:
        raise CheckpointError(f"{path}: architecture {arch!r} is not supported; this loader "
                              f"knows {sorted(SUPPORTED)}")
    family = SUPPORTED[arch]
    layer_types = hf.get("layer_types") or []
    refuse = {"hidden_act": hf.get("hidden_act", "silu") not in ("silu", "swish"),
              "mlp_bias": bool(hf.get("mlp_bias")),
              "use_sliding_window": bool(hf.get("use_sliding_window")),
              "layer_types": not isinstance(layer_types, list)
              or any(t != "full_attention" for t in layer_types),
              # Llama and Qwen3: a bias on all four projections (Qwen2's q/k/v bias is built in)
              "attention_bias": family != "qwen2" and bool(hf.get("attention_bias"))}
    for key, bad in refuse.items():
        if bad:
            raise CheckpointError(f"{path}: {key}={hf.get(key)!r} is not implemented by "
                                  f"the Decoder ({arch})")
    theta, scaling = _rope(hf, path)
    heads = _size(hf, "num_attention_heads", path)
    # Positions past the trained ones are refused, as vLLM refuses a longer max_model_len unless
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (_get_and_verify_max_len, vllm/config/model.py, 0.32).
    trained = _size(hf, "max_position_embeddings", path, default=max_seq_len or None)
    if max_seq_len is not None and max_seq_len > trained:
        raise CheckpointError(f"{path}: max_seq_len={max_seq_len} is above "
                              f"max_position_embeddings={trained}, the positions the model was "
                              f"trained for; expected at most {trained}")
    fields = dict(
        vocab_size=_size(hf, "vocab_size", path), dim=_size(hf, "hidden_size", path),
        n_layers=_size(hf, "num_hidden_layers", path), n_heads=heads,
        n_kv_heads=_size(hf, "num_key_value_heads", path, default=heads),
        hidden_dim=_size(hf, "intermediate_size", path),
        max_seq_len=max_seq_len or trained,
        rope_theta=theta, norm_eps=_positive(hf, "rms_norm_eps", path, 1e-6),
        head_size=_size(hf, "head_dim", path, default=0), qkv_bias=family == "qwen2",
        qk_norm=family == "qwen3", tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rope_scaling=scaling)
    try:
        return ModelConfig(**fields)
    except ValueError as e:         # sizes that do not fit together: say config.json's names
        names = [f"{ours} is {theirs}" for ours, theirs in HF_NAMES.items()
                 if re.search(rf"\b{ours}\b", str(e))]
        raise CheckpointError(f"{path}: {e}" + (f" ({', '.join(names)} there)" if names else "")
                              ) from None


@contextmanager
def _safetensors(path: Path):
    """``safe_open(path)``; a file that is not safetensors is refused by name."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            yield f
    except SafetensorError as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def weight_files(model_dir: str | Path) -> dict[str, Path]:
    """Checkpoint tensor name -> the .safetensors file that holds it (sharded or not)."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
                isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index}: weight_map={weight_map!r:.80} must be an object "
                                  "mapping tensor names to shard file names")
        files = {name: d / f for name, f in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.exists():
                raise CheckpointError(f"{index.name} lists shard {f.name!r}, which is missing")
        return files
    single = d / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"{str(d)!r} has neither model.safetensors nor "
                              "model.safetensors.index.json (only safetensors are read)")
    with _safetensors(single) as f:
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
    shards = sorted(set(files.values()))
    # Every tensor's shape against config.json first, from the safetensors headers and a model on
    # the meta device (shapes, no memory): a config.json with huge sizes is refused before a
    # model of that size is built.
    with torch.device("meta"):
        shapes = {n: tuple(p.shape) for n, p in Decoder(cfg).named_parameters()}
    for path in shards:
        with _safetensors(path) as f:
            for ours, theirs in wanted.items():
                got = tuple(f.get_slice(theirs).get_shape()) if files[theirs] == path else None
                if got is not None and got != shapes[ours]:
                    raise CheckpointError(f"tensor {theirs!r} has shape {got}; config.json "
                                          f"implies {shapes[ours]} for {ours}")
    model = Decoder(cfg)            # random init, overwritten below (a few seconds for 1B)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for path in shards:                             # one shard open at a time
            with _safetensors(path) as f:
                for ours in [o for o, theirs in wanted.items() if files[theirs] == path]:
                    params[ours].copy_(f.get_tensor(wanted[ours]).to(torch.float32))
    return model.requires_grad_(False).eval()        # inference only


def load_hf(model_dir: str | Path, *, max_seq_len: int | None = None):
    """(Decoder, HFTokenizer) of a Hugging Face model directory."""
    from minipaged.model.hf_tokenizer import HFTokenizer

    model = load_hf_model(model_dir, max_seq_len=max_seq_len)
    return model, HFTokenizer(model_dir)
