"""Bad command lines of the tiny model's commands (generate, train) and of generate --model (a
Hugging Face directory): each one gets one clear line on stderr and exit status 2, never a
traceback (prompts and sampling settings out of range, pools too big for memory or too small for
one sequence, settings --reference would not use, checkpoints that are not one, training runs
that cannot reach their peak). Every line but a missing PROMPT skips without torch.
"""

from __future__ import annotations

import pytest
from cli_helpers import check_one_clear_line, ids, run_table

# (command line after `minipaged`, a fragment its error message must contain). {name} is a file
# made by cli_helpers.run_table.
CASES: list[tuple[str, str]] = [
    # generate and train (the model: torch)
    ("generate", "the following arguments are required: PROMPT"),
    ("generate é", "is not a printable ASCII character"),
    ("generate ok héllo", "PROMPT 2 'héllo': its character 2, 'é', is not a printable ASCII "
                          "character"),
    ("generate x --max-tokens 0", "--max-tokens=0 must be >= 1"),
    ("generate x --temperature -1", "--temperature=-1.0 must be >= 0"),
    ("generate x --temperature nan", "--temperature=nan must be a finite number >= 0"),
    ("generate x --top-k -1", "--top-k=-1 must be >= 0"),
    ("generate x --n 0", "--n=0 must be >= 1"),
    ("generate x --beam-width 0", "--beam-width=0 must be >= 1"),
    ("generate x --n 2 --beam-width 2", "argument --beam-width: not allowed with argument --n"),
    ("generate x --num-blocks 0", "--num-blocks=0 must be >= 1"),
    ("generate x --num-blocks 100000000", "--num-blocks=100000000 x --block-size=16 (the KV "
                                          "pool) would need about"),
    ("generate x --num-blocks 1", "PROMPT 1: 1 sequence(s) of up to 81 tokens do not fit, even "
                                  "alone, in the pool's 1 blocks of --block-size=16 (given); "
                                  "expected a larger --num-blocks or --kv-cache-gb, or a smaller "
                                  "--max-tokens"),
    ("generate x --n 300 --temperature 1",
     "PROMPT 1 with --n=300: 300 sequence(s) of up to 81 tokens do not fit, even alone, in the "
     "pool's 256 blocks of --block-size=16 (the default); expected a larger --num-blocks or "
     "--kv-cache-gb, or a smaller --max-tokens or --n"),
    ("generate x --beam-width 300 --kv-cache-gb 0.001", "PROMPT 1 with --beam-width=300: 300 "
                                                        "sequence(s)"),
    (f"generate x --n {10**30} --temperature 1",
     f"1 PROMPT(s) x --n={10**30} sequences would need about"),
    (f"generate x --beam-width {10**30}", f"x --beam-width={10**30} sequences would need about"),
    (f"generate x --n {10**30} --prefix-caching --temperature 1",
     f"x --n={10**30} sequences would need about"),
    (f"generate x --n {10**30} --reference --temperature 1",
     f"x --n={10**30} sequences would need about"),
    ("generate x --kv-cache-gb 1e-9", "--kv-cache-gb=1e-09 holds 0 tokens of this model (768 B "
                                      "each), less than one block of --block-size=16; expected "
                                      "a larger --kv-cache-gb or a smaller --block-size"),
    ("generate x --kv-cache-gb 1 --num-blocks 10", "argument --num-blocks: not allowed with "
                                                   "argument --kv-cache-gb"),
    ("generate x --reference --num-blocks 5", "--reference runs the plain generator, without the "
                                              "paged engine's pool, scheduler or kernels: "
                                              "--num-blocks=5 would not be used"),
    ("generate x --reference --prefix-caching", "--prefix-caching would not be used"),
    ("generate x --reference --backend cuda-cpu", "--backend=cuda-cpu would not be used"),
    ("generate x --beam-width 2 --chunked-prefill 8", "--beam-width=2 samples every beam of a "
                                                      "request in the same step, which "
                                                      "--chunked-prefill=8 splits"),
    # what greedy decoding and beam search do not use (SamplingParams' refusal, in flag words)
    ("generate x --top-k 5 --seed 3", "--temperature=0 (the default) decodes greedily, the "
                                      "likeliest token at every step, and draws nothing at "
                                      "random: --top-k=5, --seed=3 would not be used; expected "
                                      "a temperature above 0 with them"),
    ("generate x --seed 0", "--seed=0 would not be used"),
    ("generate x --n 3", "--n=3 samples under --temperature=0 (greedy, the default) would be "
                         "identical; expected a temperature above 0"),
    ("generate x --n 3 --reference", "--n=3 samples under --temperature=0"),
    ("generate x --beam-width 2 --top-k 5", "--beam-width=2 runs beam search, which keeps the "
                                            "likeliest beams and draws nothing at random: "
                                            "--top-k=5 would not be used; expected "
                                            "--beam-width without them"),
    ("generate x --beam-width 2 --temperature 0.5 --seed 1", "--temperature=0.5, --seed=1 would "
                                                             "not be used"),
    ("generate x --kv-cache-gb 1500", "--kv-cache-gb=1500 x --block-size=16 (the KV pool) would "
                                      "need about 1.50 TiB"),
    ("generate x --block-size 0", "--block-size=0 must be >= 1"),
    ("generate x --block-size 1000000", "the default 256 blocks x --block-size=1000000 (the KV "
                                        "pool) would need about"),
    ("generate x --chunked-prefill -1", "--chunked-prefill=-1 must be >= 0"),
    ("generate x --checkpoint {missing}", "does not exist; expected an existing file"),
    ("generate x --checkpoint {dir}", "is a directory; expected a file"),
    ("generate x --checkpoint {file}", "is not a minipaged checkpoint"),
    ("generate x --backend tpu", "argument --backend: invalid choice: 'tpu'"),
    ("generate x --preemption nope", "argument --preemption: invalid choice: 'nope'"),
    ("train --steps 0", "--steps=0 must be >= 1"),
    ("train --lr 0", "--lr=0.0 must be > 0"),
    ("train --batch-size -1", "--batch-size=-1 must be >= 1"),
    ("train --out {missing_dir}/x.pt", "is in a folder that does not exist"),
    ("train --batch-size 100000000 --steps 1 --warmup 0 --out {dir}/x.pt",
     "--batch-size=100000000 (about 5.72 MiB of activations per example) would need about"),
    ("train --num-eval 11 --steps 1 --warmup 0 --out {dir}/x.pt",
     "--num-eval=11 must be >= 1 and <= 10"),
    (f"train --threads {10**30} --steps 1 --warmup 0 --out {{dir}}/x.pt",
     f"--threads={10**30} must be >= 1 and <= "),
    (f"train --seed {10**30} --steps 1 --warmup 0 --out {{dir}}/x.pt",
     f"--seed={10**30} must be >= 0 and < 2**64"),
    ("train --steps 1 --warmup 0 --num-eval 1 --out {model_pt}", "model.json', is a directory; "
                                                                 "expected a file name to write"),
    ("train --warmup 3 --steps 2 --out {dir}/x.pt", "--warmup=3 is longer than --steps=2: the "
                                                    "learning rate would never reach its peak"),
    # generate --model (a Hugging Face directory)
    ("generate --model {missing} hi", "does not exist; expected an existing directory"),
    ("generate --model {file} hi", "is a file; expected a directory"),
    ("generate --kv-cache-gb 0 hi", "--kv-cache-gb=0.0 must be > 0"),
    ("generate --chat hi", "--chat needs --model DIR"),
    ("generate hi --max-model-len 5", "--max-model-len=5 needs --model DIR"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_table(CASES, tmp_path_factory)


@pytest.mark.parametrize("line, fragment", CASES, ids=ids(CASES))
def test_bad_input_is_one_clear_line(results, line, fragment):
    check_one_clear_line(results, line, fragment, CASES)
