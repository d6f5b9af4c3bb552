"""The Hugging Face loader refuses what it cannot load, and says what and where.

On the tiny random checkpoints of tests/hf_helpers.py: a sharded checkpoint loads the same
weights; a config the loader does not support, or a malformed field, is refused naming the
field; a file of the model folder that is not that file is one line naming the file, never a
traceback; missing and unexpected tensors are named, and every shape is checked before a model
of the config's size is built; a long-context config turns chunked prefill on (and `generate
--beam-width` there says which flag avoids it); positions past the config's are refused. The
engine on these checkpoints is tested in tests/test_hf_model.py.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from minipaged._install import HF_EXTRA, TEST_STEPS, TORCH_HINT

torch = pytest.importorskip("torch", reason=f"the model {TORCH_HINT}")
pytest.importorskip(
    "transformers", reason=f"the reference is transformers; {TEST_STEPS}")
pytest.importorskip("tokenizers", reason=f"needs tokenizers; from a checkout: {HF_EXTRA}")

from minipaged.kit.cli import main  # noqa: E402
from minipaged.model.engine import LLM  # noqa: E402
from minipaged.model.hf import CheckpointError, load_hf, load_hf_model  # noqa: E402


def test_sharded_checkpoint_loads_the_same_weights(models, tmp_path):
    d, hf = models["qwen2"]
    hf.save_pretrained(tmp_path, max_shard_size="60KB")
    shutil.copy(d / "tokenizer.json", tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "the checkpoint should be sharded"
    a, b = load_hf_model(d).state_dict(), load_hf_model(tmp_path).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _edit_config(d, tmp_path, **changes):
    shutil.copytree(d, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "m"


@pytest.mark.parametrize("changes, message", [
    ({"architectures": ["MistralForCausalLM"]}, "architecture 'MistralForCausalLM'"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "'yarn'"),
    ({"intermediate_size": 96}, "shape"),
    ({"tie_word_embeddings": True}, "unexpected tensors.*lm_head.weight"),
    ({"hidden_size": -64}, r"config\.json: hidden_size=-64 must be an int >= 1"),
    ({"vocab_size": 300.5}, r"config\.json: vocab_size=300\.5 must be an int >= 1"),
    ({"num_hidden_layers": None}, r"config\.json: num_hidden_layers is missing"),
    ({"num_key_value_heads": 3}, r"config\.json: n_heads=4 must be a multiple of n_kv_heads=3 "
                                 r".*n_heads is num_attention_heads, n_kv_heads is num_key_"),
    ({"architectures": {"a": 1}}, r"config\.json: architecture \{'a': 1\} is not supported"),
    ({"rms_norm_eps": "small"}, r"config\.json: rms_norm_eps='small' must be a number > 0"),
    ({"rope_parameters": [1]}, r"config\.json: rope_parameters=\[1\] must be an object"),
    ({"rope_parameters": {"rope_type": "llama3"}}, r"config\.json: factor=None must be a number"),
])
def test_loader_refuses_what_it_cannot_load_and_says_what(models, tmp_path, changes, message):
    d = _edit_config(models["qwen3"][0], tmp_path, **changes)
    with pytest.raises(CheckpointError, match=message):
        load_hf_model(d)


# A file of a model directory overwritten with what is not that file -> what the error says.
BROKEN = [
    pytest.param("config.json", b"[1]", "config.json: expected a JSON object, got list",
                 id="config-a-list"),
    pytest.param("config.json", b"nope", "config.json: not valid JSON (Expecting value: line 1 "
                 "column 1", id="config-not-json"),
    pytest.param("model.safetensors", np.random.default_rng(0).bytes(100), "model.safetensors: "
                 "not a readable safetensors file (Error while deserializing header",
                 id="weights-random-bytes"),
    pytest.param("model.safetensors", (10**6).to_bytes(8, "little") + b"{}", "model.safetensors: "
                 "not a readable safetensors file (Error while deserializing header",
                 id="weights-bad-header-length"),
    pytest.param("model.safetensors.index.json", b'{"weight_map": 5}', "model.safetensors.index"
                 ".json: weight_map=5 must be an object mapping tensor names", id="index-map-int"),
    pytest.param("model.safetensors.index.json", b"{}", "index.json: weight_map=None must be an "
                 "object", id="index-no-map"),
    pytest.param("tokenizer.json", b"{", "tokenizer.json: not a tokenizers file",
                 id="tokenizer-not-json"),
    pytest.param("tokenizer_config.json", b"[]", "tokenizer_config.json: expected a JSON object, "
                 "got list", id="tokenizer-config-a-list"),
]


@pytest.mark.parametrize("name, data, message", BROKEN)
def test_a_broken_model_directory_is_one_line_naming_the_file(models, tmp_path, capsys, name,
                                                                data, message):
    d = _edit_config(models["qwen2"][0], tmp_path)
    (d / name).write_bytes(data)
    assert main(["generate", "--model", str(d), "hi", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"minipaged generate: {d / name}: ") and message in err, err


def test_shapes_are_checked_before_a_model_of_the_configs_size_is_built(models, tmp_path,
                                                                      monkeypatch):
    """A config.json with huge sizes over small tensors is refused from the safetensors headers
    and a model on the meta device: a model of that size (10**9 x 64 embeddings, 4 GiB of
    parameters per layer) is never built on the CPU."""
    import minipaged.model.decoder as decoder

    built = []
    real_init = decoder.Decoder.__init__

    def spy(self, cfg):
        built.append(torch.empty(0).device.type)  # the device a new tensor would land on
        real_init(self, cfg)

    monkeypatch.setattr(decoder.Decoder, "__init__", spy)
    d = _edit_config(models["qwen3"][0], tmp_path, vocab_size=10**9, intermediate_size=10**7)
    with pytest.raises(CheckpointError, match=r"model\.embed_tokens\.weight' has shape .*"
                                              r"config\.json implies \(1000000000, "):
        load_hf_model(d)
    assert built == ["meta"], built


def test_loader_names_missing_and_unexpected_tensors(models, tmp_path):
    from safetensors.torch import load_file, save_file

    d = _edit_config(models["qwen2"][0], tmp_path)
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensors.*layers\.1\.self_attn\.k_proj"):
        load_hf_model(d)
    tensors["model.layers.1.self_attn.k_proj.bias"] = torch.zeros(32)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)  # ignored buffer
    tensors["model.extra.weight"] = torch.zeros(3)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected tensors.*model\.extra\.weight$"):
        load_hf_model(d)
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_hf_model(tmp_path / "nowhere")


def test_long_context_models_chunk_their_prefill(models, tmp_path):
    d = _edit_config(models["qwen2"][0], tmp_path, max_position_embeddings=32768)
    assert LLM(model=d, num_blocks=8).chunked_prefill is True
    capped, tok = load_hf(d, max_seq_len=4096)
    assert LLM(capped, tokenizer=tok, num_blocks=8).chunked_prefill is False
    assert LLM(model=d, num_blocks=8, chunked_prefill=False).chunked_prefill is False


def test_positions_past_the_trained_ones_are_refused(models, capsys):
    """As vLLM refuses a max_model_len above the config's (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN):
    the loader by its parameter, `generate --model` by its flag."""
    d = models["qwen2"][0]
    with pytest.raises(CheckpointError, match="max_seq_len=513 is above max_position_embeddings"
                                              "=512, the positions the model was trained for"):
        load_hf_model(d, max_seq_len=513)
    assert main(["generate", "--model", str(d), "hi", "--max-model-len", "4000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-model-len=4000 is above max_position_embeddings=512" \
        in err and err.rstrip().endswith("expected at most 512"), err


def test_beams_on_a_long_context_model_say_what_to_type(models, tmp_path, capsys):
    """Such a model chunks its prefill by itself, which beam search cannot run under: the
    command line says which flag avoids it (not the API's chunked_prefill=False)."""
    d = _edit_config(models["qwen2"][0], tmp_path, max_position_embeddings=32768)
    assert main(["generate", "--model", str(d), "hi there", "--beam-width", "2"]) == 2
    err = capsys.readouterr().err
    assert "(more than 8,192) are split over steps" in err and err.rstrip().endswith(
        "expected a --max-model-len of at most 8192, or --reference"), err
    assert main(["generate", "--model", str(d), "hi there", "--beam-width", "2", "--max-tokens",
                 "2", "--max-model-len", "8192", "--kv-cache-gb", "0.01"]) == 0
