"""Hugging Face checkpoints through the paged engine, checked against transformers.

The checkpoints are tiny random Llama, Qwen2 and Qwen3 models built by transformers, nothing
downloaded (tests/hf_helpers.py says how, and why their weights are drawn with std 0.1). Proofs:
the logits equal transformers' within fp32 tolerance, greedy tokens equal transformers'
generate, the paged engine gives the reference generator's tokens under preemption, prefix
caching and chunked prefill, and for parallel samples and beams; generation stops at the
config's end token; the chat template renders like transformers'; the pool is sized from the KV
budget; ``minipaged generate --model`` prints transformers' completion. What the loader refuses,
and how it says so, is tested in tests/test_hf_model_loader.py.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from minipaged._install import HF_EXTRA, TEST_STEPS, TORCH_HINT

torch = pytest.importorskip("torch", reason=f"the model {TORCH_HINT}")
transformers = pytest.importorskip(
    "transformers", reason=f"the reference is transformers; {TEST_STEPS}")
pytest.importorskip("tokenizers", reason=f"needs tokenizers; from a checkout: {HF_EXTRA}")

from hf_helpers import FAMILIES  # noqa: E402

from minipaged.kit.cli import main  # noqa: E402
from minipaged.kit.cli.generation import _escape as escape  # noqa: E402
from minipaged.model.engine import LLM  # noqa: E402
from minipaged.model.hf import load_hf, load_hf_model  # noqa: E402
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

PROMPTS = ["the scheduler preempts", "a block table maps logical blocks to physical blocks, "
           "and the pool holds them all; when it runs out, requests wait",
           "copy on write", "prefix caching finds full blocks by the hash of their tokens " * 3]


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


def test_pool_sized_from_the_kv_budget_by_lesson_01s_arithmetic(models):
    from minipaged.model.decoder import ModelConfig

    smol = ModelConfig(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                       hidden_dim=1536, max_seq_len=8192)
    fp32 = SimpleNamespace(cfg=smol, num_parameters=lambda: 0,
                           parameters=lambda: iter([torch.zeros(1)]))
    blocks, note = pool_size(fp32, None, 16, 1.0, True)
    assert smol.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 4 == 46080
    assert smol.memory_spec(dtype_bytes=2).kv_bytes_per_token == smol.kv_bytes_per_token(2)
    assert blocks == (1 << 30) // 46080 // 16 == 1456
    assert "46,080 B per token" in note and "1,456 blocks" in note
    d, _ = models["qwen3"]
    llm = LLM(model=d, kv_cache_gb=0.001)    # 2 x 2 x 2 x 32 x 4 = 1024 B per token
    assert llm.num_blocks == int(0.001 * (1 << 30)) // 1024 // 16 and "GiB" in llm.pool_note
    assert LLM(model=d).num_blocks == (1 << 30) // 1024 // 16      # 1 GiB by default


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
    assert "--chat needs --model DIR" in capsys.readouterr().err
    assert main(["generate", "--model", str(d / "nowhere"), "hi"]) == 2
