"""KV arithmetic beyond one GPU in fp16: tensor parallelism, the KV dtype, MLA's latent KV.

What is promised, and tested here (each expected number is written out by hand from the rule,
never read back from the code under test):
- per-GPU KV bytes divide by TP while TP <= Hkv; past Hkv every GPU holds one head (the heads
  are replicated), vLLM's max(1, Hkv // TP) (vllm/config/model.py get_num_kv_heads);
- a TP that vLLM refuses (not dividing H, or neither of Hkv and TP dividing the other) is
  refused with a message naming it, before anything is computed;
- fp8 stores one byte per element, fp16 and bf16 two; the weights do not change;
- an MLA model caches (kv_lora_rank + qk_rope_head_dim) x layers elements per token, on every
  TP rank (TP does not divide it);
- a budget set by vLLM's rule is recomputed with 1/TP of the weights; the paper's fixed one stays;
- the simulator's presets stay single-GPU ones; the CLI prints the same figures as JSON.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from minipaged.kit.cli import main
from minipaged.sim.memory import (
    GPUS,
    KV_PRESETS,
    MODELS,
    PRESETS,
    GiB,
    ModelSpec,
    block_table_bytes,
    default_kv_cache_bytes,
    kv_calc,
    kv_preset,
    preset,
)


@pytest.mark.parametrize("tp, heads", [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1), (32, 1)])
def test_tp_splits_llama_kv_heads_then_replicates_them(tp, heads):
    m = MODELS["llama-3-8b"]             # 32 layers, 8 KV heads of 128, fp16
    assert m.kv_heads_per_gpu(tp) == heads
    assert m.kv_bytes_per_token_per_gpu(tp) == 2 * 32 * heads * 128 * 2
    assert kv_calc(kv_preset("llama-3-8b", tp=tp))["kv_bytes_per_token"] == 2 * 32 * heads * 256


def test_tp_beyond_the_kv_heads_stops_dividing():
    m = MODELS["llama-3-8b"]
    assert m.kv_bytes_per_token_per_gpu(2) * 2 == m.kv_bytes_per_token      # halves
    assert m.kv_bytes_per_token_per_gpu(16) == m.kv_bytes_per_token_per_gpu(8) == 16 * 1024


@pytest.mark.parametrize("tp, err, message", [
    (3, ValueError, "tp=3 must divide the 32 query heads of llama-3-8b"),
    (0, ValueError, "tp=0 is out of range: expected >= 1"),
    (True, TypeError, "tp=True must be an integer, not a bool"),
    (2.0, TypeError, "tp=2.0 must be an integer, got float"),
])
def test_a_tp_vllm_refuses_is_refused(tp, err, message):
    with pytest.raises(err, match=message):
        MODELS["llama-3-8b"].kv_heads_per_gpu(tp)
    with pytest.raises(err, match=message):
        kv_preset("llama-3-8b", tp=tp)


@pytest.mark.parametrize("call, err, message", [
    (lambda: ModelSpec("m", 0, 1, 1, 1, 1.0), ValueError, "num_layers=0 is out of range"),
    (lambda: ModelSpec("m", 1, 1, 1, 1, 1.0, dtype_bytes=2.0), TypeError,
     "dtype_bytes=2.0 must be an integer"),
    (lambda: MODELS["opt-13b"].kv_bytes_per_token_per_gpu(1, 0), ValueError,
     "dtype_bytes=0 is out of range: expected >= 1"),
    (lambda: block_table_bytes(16, 16, entry_bytes=0), ValueError,
     "entry_bytes=0 is out of range: expected >= 1"),
    (lambda: block_table_bytes(16.0, 16), TypeError, "context_len=16.0 must be an integer"),
])
def test_model_and_table_sizes_are_checked(call, err, message):
    with pytest.raises(err, match=message):
        call()


def test_numpy_sizes_are_kept_as_python_ints():
    m = ModelSpec("m", np.int32(60), 128, 128, 128, 1.0, kv_lora_rank=np.int32(2**20),
                  qk_rope_head_dim=64)
    assert type(m.num_layers) is int and m.kv_bytes_per_token == (2**20 + 64) * 60 * 2  # > 2**31


def test_neither_kv_heads_nor_tp_dividing_the_other_is_refused():
    m = ModelSpec("m", 4, 40, 20, 64, 1e9)    # 40 % 8 == 0, but 20 and 8 divide neither way
    with pytest.raises(ValueError, match="tp=8 and the 20 KV heads of m: one must divide"):
        m.kv_bytes_per_token_per_gpu(8)
    assert m.kv_heads_per_gpu(10) == 2 and m.kv_heads_per_gpu(40) == 1


def test_kv_dtype_bytes_and_weights():
    fp16 = kv_preset("llama-3-8b")
    fp8, bf16 = kv_preset("llama-3-8b", kv_dtype="fp8"), kv_preset("llama-3-8b", kv_dtype="bf16")
    assert fp8.kv_bytes_per_token == 2 * 32 * 8 * 128 * 1
    assert bf16.kv_bytes_per_token == fp16.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert fp8.num_token_slots == fp8.kv_cache_bytes // (64 * 1024)
    assert fp8.kv_cache_bytes == fp16.kv_cache_bytes                 # the budget is unchanged
    assert fp8.model.weight_bytes == fp16.model.weight_bytes         # and so are the weights
    assert kv_calc(kv_preset("opt-13b", kv_dtype="fp8"))["token_slots"] == 2 * 15728 + 1
    with pytest.raises(ValueError, match="kv_dtype='fp4' is not one of"):
        kv_preset("opt-13b", kv_dtype="fp4")


def test_mla_latent_per_token_and_tp():
    m = MODELS["deepseek-v2"]
    assert m.is_mla and not MODELS["llama-3-8b"].is_mla
    latent = (512 + 64) * 60 * 2                                     # 69,120 B
    assert m.kv_bytes_per_token == latent
    for tp in (1, 8, 16, 128):          # every rank holds the whole latent
        assert m.kv_heads_per_gpu(tp) == 1 and m.kv_bytes_per_token_per_gpu(tp) == latent
    assert m.kv_bytes_per_token_per_gpu(8, 1) == (512 + 64) * 60      # fp8
    mha = 2 * 60 * 128 * 128 * 2                                     # K and V of 128 heads
    assert mha / latent == pytest.approx(56.89, abs=0.01)
    r = kv_calc(kv_preset("deepseek-v2"), context_len=4096)
    assert (r["mla"], r["tp"], r["kv_heads_per_gpu"]) == (True, 8, 1)
    assert r["kv_bytes_per_request"] == 4096 * latent
    with pytest.raises(ValueError, match="kv_lora_rank=512 and qk_rope_head_dim=0"):
        ModelSpec("x", 1, 1, 1, 1, 1.0, kv_lora_rank=512)


def test_budgets_per_gpu():
    h100 = GPUS["h100-80gb"]
    llama2 = kv_preset("llama-3-8b", tp=2)
    assert llama2.kv_cache_bytes == int(80 * GiB * 0.9 - 8.03e9 * 2 / 2)
    assert llama2.num_token_slots == llama2.kv_cache_bytes // (2 * 32 * 4 * 128 * 2)
    ds = kv_preset("deepseek-v2")
    assert ds.tp == 8 and ds.kv_cache_bytes == int(80 * GiB * 0.9 - 236e9 * 2 / 8)
    assert ds.kv_cache_bytes == default_kv_cache_bytes(MODELS["deepseek-v2"], h100, tp=8)
    with pytest.raises(ValueError, match=r"deepseek-v2 \(109.9 GiB of weights per GPU at tp=4\)"):
        kv_preset("deepseek-v2", tp=4)
    opt2 = kv_preset("opt-13b", tp=2)         # the paper's fixed budget stays 12 GiB per GPU
    assert opt2.kv_cache_bytes == 12 * GiB and opt2.kv_bytes_per_token == 2 * 40 * 20 * 128 * 2
    assert kv_preset("llama-3-8b", tp=2, kv_cache_gb=10).kv_cache_bytes == 10 * GiB


def test_single_gpu_presets_unchanged_and_simulator_presets_only():
    assert set(PRESETS) < set(KV_PRESETS) and "deepseek-v2" not in PRESETS
    with pytest.raises(ValueError, match="model='deepseek-v2' is not one of"):
        preset("deepseek-v2")
    for name in PRESETS:
        p = preset(name)
        assert p.tp == 1 and p.kv_bytes_per_token == p.model.kv_bytes_per_token
    assert preset("opt-13b").num_token_slots == 15728


def _json(capsys, *argv: str) -> dict:
    assert main(["kv-calc", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_options(capsys):
    r = _json(capsys, "--model", "llama-3-8b", "--tp", "16")
    assert (r["tp"], r["kv_heads_per_gpu"], r["kv_bytes_per_token"]) == (16, 1, 16 * 1024)
    r = _json(capsys, "--model", "llama-3-8b", "--kv-dtype", "fp8")
    assert (r["kv_dtype_bytes"], r["kv_bytes_per_token"]) == (1, 64 * 1024)
    r = _json(capsys, "--model", "deepseek-v2")
    assert r["kv_bytes_per_token"] == 69120 and r["mla"] and r["tp"] == 8
    r = _json(capsys, "--model", "deepseek-v2", "--layers", "30", "--kv-dtype", "fp8")
    assert r["kv_bytes_per_token"] == 576 * 30 and r["mla"]  # a custom MLA model stays MLA
    r = _json(capsys, "--model", "llama-3-8b", "--kv-heads", "32", "--tp", "16")
    assert r["kv_bytes_per_token"] == 2 * 32 * 2 * 128 * 2   # the query heads stay 32
    assert main(["kv-calc", "--model", "deepseek-v2"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "tensor parallel over 8 GPUs" in text and "(MLA)" in text and "67.50 KiB" in text


def test_block_counts_are_exact_integers_at_any_context():
    """Integer ceiling division: a float one (math.ceil(n / bs)) is off beyond 2**53 tokens."""
    from minipaged.sim.memory import block_table_bytes

    assert block_table_bytes(10**17, 3) == 4 * 33333333333333334
    assert block_table_bytes(2**53 + 1, 1, entry_bytes=1) == 2**53 + 1
