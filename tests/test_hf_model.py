"""Hugging Face checkpoints through the paged engine, checked against transformers.

Nothing is downloaded: tiny random Llama, Qwen2 and Qwen3 models are built by transformers from
small configs (hidden 64, 2 layers, 4 query heads, 2 KV heads, vocabulary 300), saved with
save_pretrained into a temporary folder next to a byte-level BPE tokenizer trained here, and
loaded by minipaged.model.hf. Each family exercises its own switches: Llama with tied
embeddings and Llama 3 rope scaling (original context 64, so prompts of 100+ tokens reach the
stretched frequencies), Qwen2 with random q/k/v biases, Qwen3 with random QK-norm weights and a
head size (32) that is not hidden / heads (16). Every RMSNorm weight is randomised too, so a
swapped norm would show.

Weights are drawn with std 0.1 (transformers' default is 0.02): the logits then spread over a
few units, so the top two tokens of a greedy step differ by far more than fp32 rounding. With
std 0.02 a random model's logits are nearly flat and a greedy comparison would hinge on the
last bits of the arithmetic rather than on the implementation being right.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the model needs torch: pip install 'minipaged[torch]'")
transformers = pytest.importorskip(
    "transformers", reason="the reference is transformers: pip install 'minipaged[test]'")
pytest.importorskip("tokenizers", reason="pip install 'minipaged[hf]'")

from minipaged.kit.cli import main  # noqa: E402
from minipaged.kit.cli.generation import _escape as escape  # noqa: E402
from minipaged.model.engine import LLM  # noqa: E402
from minipaged.model.hf import CheckpointError, load_hf, load_hf_model  # noqa: E402
from minipaged.model.pool import pool_size  # noqa: E402
from minipaged.model.reference import ReferenceGenerator  # noqa: E402
from minipaged.model.sampling import SamplingParams  # noqa: E402

# fp32 logits: transformers and minipaged run the same operations in different orders (fused
# attention in transformers, NumPy softmax here; rotary angles in float32 there, float64
# here), so they agree to rounding, not bit for bit. Measured: at most 4.7e-6 on logits of
# magnitude ~4 (a few float32 ulps accumulated over 2 layers). The tolerance leaves 10x room;
# the smallest top-2 gap of any greedy step in these tests is 7.7e-4, 15x above it and 160x
# above the measured difference, so greedy comparisons do not hinge on rounding.
ATOL = 5e-5

CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
                 "'<|im_end|>\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["the paged cache keeps keys and values in blocks of sixteen tokens",
          "a block table maps logical blocks to physical blocks in the pool",
          "copy on write shares the prompt between parallel samples until one writes",
          "when the pool runs out the scheduler preempts the newest request",
          "prefix caching finds full blocks by the hash of their tokens"] * 4
PROMPTS = ["the scheduler preempts", "a block table maps logical blocks to physical blocks, "
           "and the pool holds them all; when it runs out, requests wait",
           "copy on write", "prefix caching finds full blocks by the hash of their tokens " * 3]


def _tokenizer(bos: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=290, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    if bos:   # Llama 3 style: tokenizer.json itself prepends the begin-of-text token
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


def _build(family: str, path, **overrides):
    cfg_cls, model_cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
                          "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                          "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}[family]
    tok = _tokenizer(bos=family == "llama")
    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=300, max_position_embeddings=512,
              initializer_range=0.1, eos_token_id=tok.token_to_id("<|im_end|>"),
              bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    if family == "llama":
        kw.update(tie_word_embeddings=True, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if family == "qwen3":
        kw.update(head_dim=32)
    kw.update(overrides)
    torch.manual_seed({"llama": 0, "qwen2": 1, "qwen3": 2}[family])
    hf = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.1)
    hf.save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "bos_token": "<s>" if family == "llama" else None, "chat_template": CHAT_TEMPLATE}))
    return hf


FAMILIES = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.set_num_threads(1)        # tiny matrices: threads only add contention
    out = {}
    for family in FAMILIES:
        d = tmp_path_factory.mktemp(family)
        out[family] = (d, _build(family, d))
    return out


def _tok(d):
    from minipaged.model.hf_tokenizer import HFTokenizer
    return HFTokenizer(d)


def _hf_greedy(hf, ids, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def _tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers_within_fp32_tolerance(models, family):
    d, hf = models[family]
    ours = load_hf_model(d)
    ids = torch.randint(0, 280, (1, 150), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    np.testing.assert_allclose(ours(ids)[0].numpy(), ref.numpy(), rtol=0, atol=ATOL)
    # the paged engine's first-token logits: the prompt went through reshape_and_cache and
    # paged prefill attention
    out = LLM(ours, tokenizer=_tok(d), num_blocks=64, block_size=8).generate(
        [ids[0].tolist()], SamplingParams(max_tokens=1), return_logits=True)
    np.testing.assert_allclose(out[0].outputs[0].logits[0], ref[-1].numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_identical_to_transformers_generate(models, family):
    d, hf = models[family]
    llm = LLM(model=d, num_blocks=128, block_size=8)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=40))
    hf_tok = transformers.AutoTokenizer.from_pretrained(d)
    for prompt, o in zip(PROMPTS, outs):
        assert o.prompt_token_ids == hf_tok(prompt)["input_ids"], \
            "the tokenizer must add the same special tokens as transformers'"
        assert o.outputs[0].token_ids == _hf_greedy(hf, o.prompt_token_ids, 40), prompt
    assert llm.manager.num_free_blocks == llm.num_blocks


CONFIGS = {
    "recompute": dict(num_blocks=40, block_size=4, preemption="recompute"),
    "swap": dict(num_blocks=40, block_size=4, preemption="swap"),
    "prefix-caching": dict(num_blocks=40, block_size=4, enable_prefix_caching=True),
    "chunked-prefill": dict(num_blocks=40, block_size=4, chunked_prefill=True,
                            max_num_batched_tokens=16),
}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("family", FAMILIES)
def test_paged_engine_token_identical_to_reference_under_pressure(models, family, config):
    d, _ = models[family]
    model, tok = load_hf(d)
    prompts = PROMPTS + [PROMPTS[3]]        # a repeated prompt: full blocks to share by hash
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = ReferenceGenerator(model, tokenizer=tok).generate(prompts, params)
    llm = LLM(model, tokenizer=tok, **CONFIGS[config])
    assert _tokens(llm.generate(prompts, params)) == _tokens(ref)
    if config in ("recompute", "swap"):
        assert llm.num_preemptions > 0, "the pool was meant to be too small for all requests"
    if config == "swap":
        assert llm.runner.num_blocks_swapped > 0
    if config == "prefix-caching":
        assert llm.manager.allocator.hits > 0     # the repeated prompt's full blocks were found
    assert llm.manager.num_free_blocks == llm.num_blocks


def test_parallel_samples_and_beams_match_reference(models):
    d, _ = models["qwen2"]
    model, tok = load_hf(d)
    llm, ref = LLM(model, tokenizer=tok, num_blocks=64, block_size=4), \
        ReferenceGenerator(model, tokenizer=tok)
    for params in (SamplingParams(max_tokens=12, n=3, temperature=0.8, seed=7),
                   SamplingParams(max_tokens=12, beam_width=3)):
        assert _tokens(llm.generate(PROMPTS[:2], params)) == \
            _tokens(ref.generate(PROMPTS[:2], params))


def test_generation_stops_at_the_configs_end_token(models, tmp_path):
    d, _ = models["qwen3"]
    first = LLM(model=d, num_blocks=64).generate([PROMPTS[0]], SamplingParams(
        max_tokens=20, ignore_eos=True))[0].outputs[0].token_ids
    # Declare the model's 6th greedy token an end-of-sequence id (generation_config.json, as
    # real checkpoints do); generation must end right there, as transformers' does.
    stop = first[5]
    shutil.copytree(d, tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop]}))
    out = LLM(model=tmp_path / "m", num_blocks=64).generate(
        [PROMPTS[0]], SamplingParams(max_tokens=20))[0].outputs[0]
    assert out.token_ids == first[:first.index(stop) + 1] and out.finish_reason == "stop"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert _hf_greedy(hf, _tok(d).encode(PROMPTS[0]), 20) == out.token_ids


def test_chat_template_renders_like_transformers(models):
    d, _ = models["llama"]
    tok = _tok(d)
    ours = tok.encode(tok.chat_prompt("what is a block table?"), bos=False)
    theirs = transformers.AutoTokenizer.from_pretrained(d).apply_chat_template(
        [{"role": "user", "content": "what is a block table?"}], add_generation_prompt=True,
        tokenize=True)
    if hasattr(theirs, "keys"):        # a BatchEncoding in recent transformers
        theirs = theirs["input_ids"]
    assert ours == list(theirs)


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


def test_pool_sized_from_the_kv_budget_by_lesson_01s_arithmetic(models):
    from minipaged.model.decoder import ModelConfig

    smol = ModelConfig(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                       hidden_dim=1536, max_seq_len=8192)
    blocks, note = pool_size(SimpleNamespace(cfg=smol, num_parameters=lambda: 0), None, 16,
                             1.0, True)
    assert smol.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 4 == 46080
    assert blocks == (1 << 30) // 46080 // 16 == 1456
    assert "46,080 B per token" in note and "1,456 blocks" in note
    d, _ = models["qwen3"]
    llm = LLM(model=d, kv_cache_gb=0.001)    # 2 x 2 x 2 x 32 x 4 = 1024 B per token
    assert llm.num_blocks == int(0.001 * (1 << 30)) // 1024 // 16 and "GiB" in llm.pool_note
    assert LLM(model=d).num_blocks == (1 << 30) // 1024 // 16      # 1 GiB by default


def test_long_context_models_chunk_their_prefill(models, tmp_path):
    d = _edit_config(models["qwen2"][0], tmp_path, max_position_embeddings=32768)
    assert LLM(model=d, num_blocks=8).chunked_prefill is True
    capped, tok = load_hf(d, max_seq_len=4096)
    assert LLM(capped, tokenizer=tok, num_blocks=8).chunked_prefill is False
    assert LLM(model=d, num_blocks=8, chunked_prefill=False).chunked_prefill is False


def test_generate_cli_with_a_model_directory(models, capsys):
    d, hf = models["llama"]
    assert main(["generate", "--model", str(d), PROMPTS[0], "--max-tokens", "8",
                 "--kv-cache-gb", "0.01"]) == 0
    out, err = capsys.readouterr()
    tok = _tok(d)
    expect = tok.decode(_hf_greedy(hf, tok.encode(PROMPTS[0]), 8))
    assert out == f"{escape(PROMPTS[0])} => {escape(expect)}\n"
    assert "B per token" in err
    assert main(["generate", "--model", str(d), "--chat", "hi", "--max-tokens", "4"]) == 0
    assert "1 GiB / that" in capsys.readouterr().err   # the default budget, as --help says
    assert main(["generate", "--chat", "hi"]) == 2
    assert "need --model" in capsys.readouterr().err
    assert main(["generate", "--model", str(d / "nowhere"), "hi"]) == 2
