"""The tiny model: tokenizer, corpus, decoder, sampling rules, reference generator, checkpoint.

The engine's proofs (tests/test_engine.py) compare against the reference generator; these tests
make sure the pieces under both are right on their own: the packed inference pass equals the
training pass, sampling is reproducible per (seed, sample, step), and the shipped checkpoint
still scores on held-out prompts what the training script reported.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.model import corpus
from minipaged.model.sampling import Beam, SamplingParams, apply_stop, beam_step, sample_token
from minipaged.model.tokenizer import BOS, CHARS, EOS, VOCAB_SIZE, CharTokenizer

tok = CharTokenizer()


# ---- tokenizer (no torch) -------------------------------------------------------------------
@given(st.text(alphabet=CHARS, max_size=200))
def test_tokenizer_round_trip_any_printable_ascii(text):
    ids = tok.encode(text)
    assert ids[0] == BOS and len(ids) == len(text) + 1
    assert all(3 <= i < VOCAB_SIZE for i in ids[1:])
    assert tok.decode(ids) == text


def test_tokenizer_covers_printable_ascii_and_rejects_the_rest():
    assert VOCAB_SIZE == 100
    assert tok.decode(tok.encode("".join(chr(c) for c in range(32, 127)))) == \
        "".join(chr(c) for c in range(32, 127))
    with pytest.raises(ValueError, match=r"text\[2\] = 'é'"):
        tok.encode("caé")
    with pytest.raises(TypeError, match="must be a str"):
        tok.encode(b"abc")
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([VOCAB_SIZE])
    assert tok.decode([BOS, 40, EOS]) == CHARS[40 - 3]
    assert tok.decode([BOS, EOS], skip_special=False) == "<bos><eos>"


# ---- corpus (no torch) ----------------------------------------------------------------------
@given(st.integers(0, corpus.MAX_START))
def test_corpus_answers_check(start):
    p, a = corpus.prompt_for(start), corpus.answer_for(start)
    assert corpus.check(p, a)
    assert a.startswith(f" {start} ") or start == 0
    assert a.endswith(" 0.") or a == " 0."
    assert not corpus.check(p, a[:-1])
    assert not corpus.check(p, a.replace(" 0.", " 1."))


def test_held_out_starts_are_never_trained_on():
    train, held = set(corpus.train_starts()), corpus.held_out_starts()
    assert held and not train.intersection(held)
    assert sorted(train.union(held)) == corpus.all_starts()
    with pytest.raises(ValueError, match="not a counting prompt"):
        corpus.check("hello", " 1.")


# ---- sampling rules (no torch) -----------------------------------------------------------------
@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(max_tokens=0), ValueError, "max_tokens=0 is out of range: expected >= 1"),
    (dict(max_tokens=1.5), TypeError, "max_tokens=1.5 must be an integer"),
    (dict(temperature=-0.1), ValueError, "temperature=-0.1 is out of range: expected >= 0"),
    (dict(temperature=float("nan")), ValueError, "temperature=nan must be finite"),
    (dict(temperature="1"), TypeError, "temperature='1' must be a number, got str"),
    (dict(top_k=-1), ValueError, "top_k=-1 is out of range: expected >= 0"),
    (dict(n=0), ValueError, "n=0 is out of range: expected >= 1"),
    (dict(beam_width=0), ValueError, "beam_width=0 is out of range: expected >= 1"),
    (dict(beam_width=2, n=2), ValueError, "n must be 1"),
    (dict(seed=-3), ValueError, "seed=-3 is out of range: expected >= 0"),
    (dict(seed=True), TypeError, "seed=True must be an integer, not a bool"),
    (dict(stop=("",)), ValueError, "stop[0]='' is empty; expected non-empty strings"),
    # what the decoding would not read (the command line's wording: kit/cli/common.py)
    (dict(beam_width=2, temperature=1.0, seed=4), ValueError, "beam_width=2 runs beam search, "
     "which keeps the likeliest beams and draws nothing at random: temperature=1.0, seed=4 "
     "would not be used; expected beam_width without them"),
    (dict(beam_width=2, top_k=3), ValueError, "top_k=3 would not be used"),
    (dict(beam_width=2, stop=[" 49"], ignore_eos=True), ValueError, "beam_width=2 runs beam "
     "search, whose hypotheses end at <eos> or after max_tokens steps: stop=(' 49',), "
     "ignore_eos=True would not be used; expected beam_width without them"),
    (dict(top_k=5, seed=3), ValueError, "temperature=0 (the default) decodes greedily, the "
     "likeliest token at every step, and draws nothing at random: top_k=5, seed=3 would not be "
     "used; expected a temperature above 0 with them"),
    (dict(temperature=0.0, seed=0), ValueError, "seed=0 would not be used"),
    (dict(n=3), ValueError, "n=3 samples under temperature=0 (greedy, the default) would be "
     "identical; expected a temperature above 0"),
    # stop: a string or a sequence of strings, never read character by character or by key
    (dict(stop=123), TypeError, "stop=123 must be a string or a sequence of strings, got int"),
    (dict(stop=b"ab"), TypeError, "stop=b'ab' must be a string or a sequence of strings, got "
     "bytes"),
    (dict(stop={"a": 1}), TypeError, "stop={'a': 1} must be a string or a sequence of strings, "
     "got dict"),
    (dict(stop=["a", 1]), TypeError, "stop[1]=1 must be a string, got int"),
])
def test_bad_sampling_params_get_clear_errors(kwargs, exc, words):
    with pytest.raises(exc, match=re.escape(words)):
        SamplingParams(**kwargs)


def test_stop_accepts_a_single_string():
    assert SamplingParams(stop="x").stop == ("x",)
    assert apply_stop("ab.cd", (".", "c")) == ("ab", True)
    assert apply_stop("abcd", ("z",)) == ("abcd", False)


@given(st.integers(0, 2**32), st.integers(0, 5), st.integers(0, 50),
       st.floats(0.1, 3.0), st.integers(0, 10))
@settings(max_examples=30)
def test_sampling_is_reproducible_per_seed_sample_and_step(seed, index, step, temp, top_k):
    logits = np.random.default_rng(seed % 1000).normal(size=VOCAB_SIZE)
    p = SamplingParams(temperature=temp, top_k=top_k)
    a = sample_token(logits, p, seed, index, step)
    assert a == sample_token(logits, p, seed, index, step)
    if top_k:
        assert a in np.argsort(-logits)[:top_k]
    assert sample_token(logits, SamplingParams(), seed, index, step) == int(np.argmax(logits))
    assert sample_token(logits, SamplingParams(temperature=1.0, top_k=1), seed, index, step) == \
        int(np.argmax(logits))


def _plain_sample_token(logits, params, seed, index, step):
    """sample_token as it was: softmax(logits / T) (overflows to NaN for a tiny T)."""
    z = np.asarray(logits, dtype=np.float64) / params.temperature
    if 0 < params.top_k < z.shape[0]:
        z = np.where(z >= np.sort(z)[-params.top_k], z, -np.inf)
    cdf = np.cumsum(np.exp(z - z.max()))
    u = np.random.default_rng([seed, index, step]).random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), z.shape[0] - 1))


def test_a_tiny_temperature_is_greedy_and_others_draw_as_before():
    """The largest logit is subtracted before dividing by T: a temperature so small that
    logits / T overflowed (inf - inf = NaN picked the last token, '~') now gives the argmax,
    and ordinary temperatures give the tokens the plain formula gave."""
    rng = np.random.default_rng(0)
    for k in range(2000):
        logits = (rng.normal(size=VOCAB_SIZE) * rng.uniform(0.5, 8)).astype(np.float32)
        for t in (1e-320, 5e-324, 1e-300, 1e-30):
            p = SamplingParams(temperature=t, top_k=[0, 5][k % 2])
            assert sample_token(logits, p, k, 0, 0) == int(np.argmax(logits))
        p = SamplingParams(temperature=float(rng.uniform(0.05, 5)), top_k=[0, 5, 20][k % 3])
        assert sample_token(logits, p, k, 1, 2) == _plain_sample_token(logits, p, k, 1, 2)


def test_beam_step_keeps_best_and_finishes_eos():
    lp = np.log(np.full(8, 1e-9))
    a, b = lp.copy(), lp.copy()
    a[[3, EOS, 4]] = np.log([0.5, 0.4, 0.1])
    b[[5, 6]] = np.log([0.9, 0.1])
    live = [Beam([7], -1.0), Beam([8], -0.1)]
    survivors, finished = beam_step(live, [a, b], beam_width=2, eos_id=EOS)
    # Candidates by score: (1,5) -0.21, (0,3) -1.69, (0,eos) -1.92, (1,6) -2.40, (0,4) -3.30.
    # The best 2 * width = 4 are taken: <eos> finishes a hypothesis, two others stay live.
    assert [s[:2] for s in survivors] == [(1, 5), (0, 3)]
    assert survivors[0][2] == pytest.approx(-0.1 + np.log(0.9))
    assert [f.tokens for f in finished] == [[7, EOS]]
    assert finished[0].cum_logprob == pytest.approx(-1.0 + np.log(0.4))


# ---- the decoder (torch) ---------------------------------------------------------------------
@pytest.mark.requires("torch")
def test_config_validation():
    from minipaged.model.decoder import ModelConfig
    with pytest.raises(ValueError, match="n_heads=4 must be a multiple of n_kv_heads=3"):
        ModelConfig(n_kv_heads=3)
    with pytest.raises(ValueError, match="mlp='relu' is not one of"):
        ModelConfig(mlp="relu")
    with pytest.raises(ValueError, match="dim=0 is out of range: expected >= 1"):
        ModelConfig(dim=0)
    with pytest.raises(TypeError, match="n_layers=True must be an integer, not a bool"):
        ModelConfig(n_layers=True)


@pytest.mark.requires("torch")
@pytest.mark.parametrize("mlp, kv_heads", [("swiglu", 2), ("gelu", 1), ("swiglu", 4)])
def test_packed_chunks_over_a_cache_equal_the_training_pass(mlp, kv_heads):
    """Feeding a sequence in chunks through forward_packed (K/V kept in a contiguous cache)
    gives the logits of the ordinary causal pass. Tolerance 2e-5: the training pass uses torch's
    fused attention, the packed pass a plain softmax, so float32 sums are ordered differently."""
    import torch

    from minipaged.model.decoder import Decoder, ModelConfig
    from minipaged.model.reference import ContiguousCache, ReferenceGenerator

    torch.manual_seed(0)
    model = Decoder(ModelConfig(mlp=mlp, n_kv_heads=kv_heads, max_seq_len=64)).eval()
    ids = torch.randint(3, VOCAB_SIZE, (1, 40))
    with torch.no_grad():
        full = model(ids)[0].numpy()                                  # [T, V]
    gen = ReferenceGenerator(model, attention="torch")
    cache = ContiguousCache(model, np.float32)
    cuts = [0, 7, 8, 23, 24, 40]
    for a, b in zip(cuts, cuts[1:]):
        last = gen._forward(cache, ids[0, a:b].tolist())
        np.testing.assert_allclose(last, full[b - 1], atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="max_seq_len=64"):
        model.forward_packed(torch.tensor([5]), torch.tensor([64]), lambda *a: None)


# ---- the shipped checkpoint (torch) -------------------------------------------------------------
@pytest.mark.requires("torch")
def test_shipped_checkpoint_scores_what_training_reported():
    import torch

    from minipaged.model.checkpoint import DEFAULT_CHECKPOINT, load_model, read_report
    from minipaged.model.train import evaluate

    torch.set_num_threads(1)
    assert DEFAULT_CHECKPOINT.stat().st_size < 4 * 2**20, "the checkpoint must stay a few MB"
    report = read_report()
    model = load_model()
    assert model.num_parameters() == report["parameters"]
    score = evaluate(model, report["num_eval"], attention="torch")
    assert score >= report["held_out_exact_match"]
    assert score >= 0.5, "the shipped model should count right on most unseen prompts"


@pytest.mark.requires("torch")
def test_load_model_missing_file_is_a_clear_error(tmp_path):
    from minipaged.model.checkpoint import load_model
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope.pt")


@pytest.mark.requires("torch")
def test_training_refuses_more_held_out_prompts_than_there_are(tmp_path):
    """A score on num_eval=11 would be a score on the 10 held-out prompts: refused before any
    training step, and by evaluate itself."""
    from minipaged.model.checkpoint import load_model
    from minipaged.model.train import NUM_EVAL, TrainSettings, evaluate, train

    assert NUM_EVAL == len(corpus.held_out_starts()) == 10
    lines = []
    with pytest.raises(ValueError, match="num_eval=11 is more than the 10 held-out prompts"):
        train(TrainSettings(steps=1, warmup=0, num_eval=11), tmp_path / "x.pt", log=lines.append)
    assert not lines and not list(tmp_path.iterdir()), "it trained before refusing"
    with pytest.raises(ValueError, match="num_eval=0 is out of range: expected >= 1"):
        evaluate(load_model(), 0)


@pytest.mark.requires("torch")
def test_training_refuses_a_warmup_longer_than_the_run(tmp_path):
    """The Python API refuses it, before any step, by the rule the command line uses (whose
    message names --warmup and --steps: tests/test_cli_model_errors.py)."""
    from minipaged.model.train import TrainSettings, train

    lines = []
    with pytest.raises(ValueError, match=r"warmup=3 is longer than steps=2: the learning rate "
                                         r"would never reach its peak nor decay"):
        train(TrainSettings(steps=2, warmup=3), tmp_path / "x.pt", log=lines.append)
    assert not lines and not list(tmp_path.iterdir()), "it trained before refusing"
