"""The paged engine under bad input and interruption: clear errors, no hang, nothing left behind.

Proofs:
    * bad arguments to LLM and to generate get errors that say what is wrong, by the argument
      the caller gave, before anything is allocated (a pool or n records too big for memory);
    * a temperature so small that logits / T overflows decodes greedily;
    * runs that once hung finish (a preempted group of samples that cannot be swapped back in,
      an arrival far in the future), each under a time limit;
    * a generate interrupted mid-run (an exception or Ctrl-C in on_step, or in the first forward
      pass) leaves the pool full and no stale prefix-cache hit, and the next call gives the
      reference's tokens; a step that schedules nothing is reported, not looped on.
"""

from __future__ import annotations

import re

import pytest
from engine_helpers import MAX_TOKENS, check_pool_full

pytestmark = pytest.mark.requires("torch")


def test_bad_inputs_get_clear_errors(model):
    from minipaged.model.engine import LLM, PoolTooSmallError
    from minipaged.model.sampling import SamplingParams

    with pytest.raises(ValueError, match="num_blocks=0 is out of range: expected >= 1"):
        LLM(model, num_blocks=0)
    with pytest.raises(TypeError, match="block_size=4.0 must be an integer, got float"):
        LLM(model, num_blocks=8, block_size=4.0)
    with pytest.raises(ValueError, match="preemption='drop' is not one of"):
        LLM(model, preemption="drop")
    for flag in ("enable_prefix_caching", "chunked_prefill"):  # 'no' was truthy: True
        with pytest.raises(TypeError, match=f"{flag}='no' must be a bool"):
            LLM(model, **{flag: "no"})
    llm = LLM(model, num_blocks=8, block_size=4)
    with pytest.raises(PoolTooSmallError, match=r"prompts\[1\] needs up to 13 blocks .* but "
                                                r"num_blocks=8") as refused:
        llm.generate(["a", "count down from 30:"], SamplingParams(max_tokens=30))
    # what a front end words its own refusal with (minipaged generate names its flags)
    assert (refused.value.prompt_index, refused.value.num_seqs, refused.value.final_len) == (
        1, 1, 20 + 30 - 1)
    with pytest.raises(ValueError, match=r"text\[0\] = 'é'"):
        llm.generate(["é"])
    with pytest.raises(ValueError, match=r"prompts\[0\] has 301 tokens"):
        llm.generate(["a" * 300])
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        llm.generate(["a"], {"max_tokens": 3})
    with pytest.raises(ValueError, match="non-empty list"):
        llm.generate([])
    with pytest.raises(ValueError, match="backend='tpu' is not one of"):
        LLM(model, backend="tpu")
    with pytest.raises(ValueError, match=r"arrival_steps\[0\]=-1 is out of range: expected >= 0"):
        llm.generate(["a"], SamplingParams(max_tokens=2), arrival_steps=[-1])
    with pytest.raises(ValueError, match=r"arrival_steps has 2 steps; expected one per prompt"):
        llm.generate(["a"], SamplingParams(max_tokens=2), arrival_steps=[0, 1])
    check_pool_full(llm)


def test_bad_engine_arguments_are_refused_by_name_before_anything_is_made(model, monkeypatch):
    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator

    monkeypatch.setattr("minipaged.sim.host.available_memory", lambda: 16 << 30)
    for kwargs, exc, words in [
        (dict(model=5), TypeError, "model=5 must be a Decoder, a Hugging Face model directory "
                                   "or None (the shipped model), got int"),
        (dict(tokenizer=5), TypeError, "tokenizer=5 must be a tokenizer (with encode, decode, "
                                       "vocab_size, eos_id, eos_ids), got int"),
        (dict(num_blocks=10, kv_cache_gb=1.0), ValueError, "num_blocks=10 and kv_cache_gb=1.0 "
                                                           "both size the KV pool; expected one"),
        (dict(preemption="swap", num_cpu_blocks=0), ValueError,
         "preemption='swap' swaps preempted sequences out to a CPU pool, but num_cpu_blocks=0 "
         "makes none; expected num_cpu_blocks >= 1 (None: as many as num_blocks), or "
         "preemption='recompute'"),
        (dict(num_cpu_blocks=5), ValueError, "preemption='recompute' swaps nothing out: "
                                             "num_cpu_blocks=5 would not be used"),
        # too big for this machine (half of 16 GiB here), refused by what the caller gave
        (dict(kv_cache_gb=1500), ValueError, "kv_cache_gb=1500 x block_size=16 (the KV pool) "
                                             "would need about 1.50 TiB of memory; at most "
                                             "8.00 GiB"),
        (dict(kv_cache_gb=1e6), ValueError, "kv_cache_gb=1e+06 x block_size=16 (the KV pool)"),
        (dict(block_size=2**20), ValueError, "the default 256 blocks x block_size=1048576 (the "
                                             "KV pool) would need about 192.00 GiB"),
        # 5.86 GiB alone; its CPU pool, as many blocks again, counts too
        (dict(num_blocks=500_000, preemption="swap"), ValueError,
         "num_blocks=500000 x block_size=16 (the KV pool) would need about 11.58 GiB"),
    ]:
        with pytest.raises(exc, match=re.escape(words)):
            LLM(**{"model": model, **kwargs})
    with pytest.raises(TypeError, match="tokenizer=5 must be a tokenizer"):
        ReferenceGenerator(model, tokenizer=5)


def test_bad_generate_arguments_are_refused_by_name(model, monkeypatch):
    from time_limit import time_limit

    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams

    llm = LLM(model, num_blocks=8, block_size=4)
    for gen in (llm, ReferenceGenerator(model)):       # 'no' was read as True
        with pytest.raises(TypeError, match="return_logits='no' must be a bool, got str"):
            gen.generate(["a"], SamplingParams(max_tokens=2), return_logits="no")
        with pytest.raises(ValueError, match="beam_width=2 runs beam search, whose completions "
                                             "carry no logits: return_logits=True would not be "
                                             "used; expected return_logits=False"):
            gen.generate(["a"], SamplingParams(max_tokens=2, beam_width=2), return_logits=True)
    for steps in (1, {0: 1}):
        with pytest.raises(TypeError, match=f"arrival_steps={steps} must be a sequence of "
                                            "steps, one per prompt"):
            llm.generate(["a"], SamplingParams(max_tokens=2), arrival_steps=steps)
    # n samples with prefix caching are n requests, one record each: refused at once when
    # memory cannot hold the records (it ran out of memory after 45 s)
    monkeypatch.setattr("minipaged.sim.host.available_memory", lambda: 16 << 30)
    with time_limit(10), pytest.raises(ValueError, match=re.escape(
            "1 prompt(s) x n=100000000 samples (one request each with "
            "enable_prefix_caching=True) would need about 745.06 GiB of memory")):
        LLM(model, enable_prefix_caching=True).generate(
            "1", SamplingParams(n=10**8, max_tokens=1, temperature=1.0))
    check_pool_full(llm)


def test_bad_prompts_and_params_lists_say_what_was_expected(model):
    """A prompt of max_seq_len tokens was refused as 'has 256 tokens; max_seq_len is 256', a bad
    id without naming it, and an empty or short list of params without the counts (the empty
    one as 'must be a SamplingParams, got list', though lists are taken)."""
    from minipaged.model.engine import LLM
    from minipaged.model.sampling import SamplingParams

    llm, L = LLM(model, num_blocks=8, block_size=4), model.cfg.max_seq_len
    with pytest.raises(ValueError, match=re.escape(f"prompts[0] has {L} tokens (with any "
                                                   f"special tokens); expected at most {L - 1}")):
        llm.generate(["a" * (L - 1)])
    with pytest.raises(ValueError, match=re.escape("prompts[1] holds token id 100, outside "
                                                   "[0, 100)")):
        llm.generate([[1], [2, 100]])
    two = SamplingParams(max_tokens=2)
    for params, got in (([], 0), ([two], 1), ([two, two, two], 3)):
        with pytest.raises(ValueError, match=re.escape(f"params has {got} SamplingParams for 2 "
                                                       "prompts; expected one per prompt")):
            llm.generate(["a", "b"], params)
    check_pool_full(llm)


def test_a_tiny_temperature_decodes_greedily(model):
    """softmax(logits / 1e-320) overflowed: inf - inf is NaN, and the last token ('~') was
    picked at every step, by the engine and the reference alike."""
    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams

    greedy = SamplingParams(max_tokens=12)
    want = ReferenceGenerator(model).generate("3 4 5", greedy)[0].outputs[0].token_ids
    for t in (1e-320, 5e-324, 1e-300):
        p = SamplingParams(max_tokens=12, temperature=t, seed=1)
        for gen in (LLM(model), ReferenceGenerator(model)):
            assert gen.generate("3 4 5", p)[0].outputs[0].token_ids == want


# ---- nothing hangs, and an interrupted call leaves nothing behind -----------------------------


def test_three_samples_in_a_three_block_pool_with_swap_finish(model):
    """`minipaged generate 'count down from 8:' 'count down from 33:' --n 3 --temperature 0.63
    --seed 670 --max-tokens 10 --num-blocks 3 --block-size 32 --preemption swap` once spun
    forever: the preempted group of three samples shares one block, and swapping it back in
    would need that block plus one per sample, 4 > 3. It is recomputed instead, and the
    samples are still the reference's."""
    from time_limit import time_limit

    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams

    prompts = ["count down from 8:", "count down from 33:"]
    p = SamplingParams(max_tokens=10, temperature=0.63, n=3, seed=670)
    llm = LLM(model, num_blocks=3, block_size=32, preemption="swap")
    with time_limit(60):
        outs = llm.generate(prompts, p)
    ref = ReferenceGenerator(model).generate(prompts, p)
    for a, b in zip(outs, ref):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert llm.num_preemptions > 0 and llm.runner.num_blocks_swapped == 0
    check_pool_full(llm)


def test_a_far_arrival_jumps_over_idle_steps(model):
    from time_limit import time_limit

    from minipaged.model.engine import LLM
    from minipaged.model.sampling import SamplingParams

    p = SamplingParams(max_tokens=6)
    llm = LLM(model, num_blocks=16, block_size=4)
    now = llm.generate(["count down from 9:"], p)
    steps = llm.num_steps
    with time_limit(30):
        later = llm.generate(["count down from 9:"], p, arrival_steps=[10**9])
    assert later[0].outputs[0].token_ids == now[0].outputs[0].token_ids
    assert llm.num_steps == 2 * steps, "only the steps that ran are counted"


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_interrupted_generate_leaves_nothing_in_the_manager(model, reference, prefix, error):
    from minipaged.model.engine import LLM
    from minipaged.model.sampling import SamplingParams

    prompts = ["count down from 52:", "count down from 13:", "Hello, paged world!"]
    llm = LLM(model, num_blocks=40, block_size=4, enable_prefix_caching=prefix,
              preemption="swap")

    def on_step(stats):
        if stats.step == 5:
            raise error("stop")

    llm.on_step = on_step
    with pytest.raises(error, match="stop"):
        llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    check_pool_full(llm)
    llm.on_step = None
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    for o in outs:
        assert o.outputs[0].token_ids == reference[o.prompt].token_ids
    check_pool_full(llm)


def test_the_engine_reports_a_step_that_does_nothing(model, monkeypatch):
    from minipaged.model.engine import LLM
    from minipaged.serving.scheduler import NoProgressError, Scheduler, SchedulerOutput

    llm = LLM(model, num_blocks=8, block_size=4)
    monkeypatch.setattr(Scheduler, "schedule", lambda self: SchedulerOutput())
    with pytest.raises(NoProgressError, match=r"step 0: no progress: request 0 \(waiting"):
        llm.generate(["hi"])
    check_pool_full(llm)


def test_an_interrupted_first_forward_pass_leaves_no_stale_prefix_cache_hit(model, reference,
                                                                          monkeypatch):
    """Ctrl-C during the first forward pass: the prompts' full blocks were already registered
    in the prefix cache, their K/V never written. A later call must not hit them."""
    from minipaged.model.engine import LLM
    from minipaged.model.sampling import SamplingParams

    prompts = ["count down from 52:", "Hello, paged world!"]
    llm = LLM(model, num_blocks=40, block_size=4, enable_prefix_caching=True)

    def interrupted(work):
        raise KeyboardInterrupt

    with monkeypatch.context() as mp:
        mp.setattr(llm.runner, "execute", interrupted)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    check_pool_full(llm)
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    for o in outs:
        assert o.outputs[0].token_ids == reference[o.prompt].token_ids
