"""Bad command lines of kv-calc and the serving simulator (simulate, experiment, factcheck): each
one gets one clear line on stderr and exit status 2, never a traceback (sizes out of range, a
model that --tp cannot shard, a run too big for memory or a pool too small for one block,
settings a policy would ignore, workloads that are not one, output paths that cannot be
written).
"""

from __future__ import annotations

import pytest
from cli_helpers import BIG, check_one_clear_line, ids, run_table

# (command line after `minipaged`, a fragment its error message must contain). {name} is a file
# made by cli_helpers.run_table.
CASES: list[tuple[str, str]] = [
    # kv-calc
    ("kv-calc --layers 0", "--layers=0 must be >= 1"),
    ("kv-calc --kv-heads 0", "--kv-heads=0 must be >= 1"),
    ("kv-calc --dtype-bytes 0", "argument --dtype-bytes: invalid choice: 0 (choose from 1, 2, 4, "
                                "8)"),
    ("kv-calc --dtype-bytes 3", "argument --dtype-bytes: invalid choice: 3"),
    ("kv-calc --entry-bytes 3", "argument --entry-bytes: invalid choice: 3 (choose from 1, 2, 4, "
                                "8)"),
    ("kv-calc --head-size -3", "--head-size=-3 must be >= 1"),
    ("kv-calc --num-requests -5", "--num-requests=-5 must be >= 1"),
    ("kv-calc --block-size 0", "--block-size=0 must be >= 1"),
    ("kv-calc --context-len 0", "--context-len=0 must be >= 1"),
    ("kv-calc --entry-bytes 0", "argument --entry-bytes: invalid choice: 0"),
    ("kv-calc --kv-cache-gb 0", "--kv-cache-gb=0.0 must be > 0"),
    ("kv-calc --kv-cache-gb -1", "--kv-cache-gb=-1.0 must be > 0"),
    ("kv-calc --kv-cache-gb inf", "--kv-cache-gb=inf must be a finite number"),
    ("kv-calc --kv-cache-gb 1e300", "--kv-cache-gb=1e+300 must be > 0 and <= "),
    ("kv-calc --model gpt-9", "argument --model: invalid choice: 'gpt-9'"),
    ("kv-calc --layers 2.5", "argument --layers: invalid int value: '2.5'"),
    ("kv-calc --tp 0", "--tp=0 must be >= 1"),
    ("kv-calc --tp 2.5", "argument --tp: invalid int value: '2.5'"),
    ("kv-calc --tp 3", "--tp=3 cannot shard opt-13b: vLLM needs --tp to divide the 40 query "
                       "heads, and --tp and the 40 KV heads must divide one another"),
    ("kv-calc --model llama-3-8b --tp 3", "--tp=3 cannot shard llama-3-8b: vLLM needs --tp to "
                                          "divide the 32 query heads"),
    ("kv-calc --kv-heads 20 --tp 8", "--tp=8 cannot shard opt-13b (custom): vLLM needs --tp to "
                                     "divide the 40 query heads, and --tp and the 20 KV heads"),
    ("kv-calc --model deepseek-v2 --tp 3", "--tp=3 cannot shard deepseek-v2: vLLM needs --tp to "
                                           "divide the 128 query heads"),
    ("kv-calc --model deepseek-v2 --tp 4", "(109.9 GiB of weights per GPU at tp=4) leaves no KV"),
    ("kv-calc --kv-dtype fp4", "argument --kv-dtype: invalid choice: 'fp4'"),
    ("kv-calc --kv-dtype fp8 --dtype-bytes 1", "--kv-dtype and --dtype-bytes both set the bytes"),
    ("kv-calc --model deepseek-v2 --kv-heads 2", "do not change the KV of deepseek-v2: MLA"),
    # simulate
    ("simulate --num-requests -5", "--num-requests=-5 must be >= 1"),
    ("simulate --num-requests 0", "--num-requests=0 must be >= 1"),
    (f"simulate --num-requests {BIG}", f"--num-requests={BIG} would need about"),
    ("simulate --kv-cache-gb 2e6", "--kv-cache-gb=2e+06 (163,840,000 simulated blocks) would "
                                   "need about"),
    ("simulate --kv-cache-gb 0.00001", "--kv-cache-gb=1e-05 holds 0 token slots, less than one "
                                       "block of --block-size=16; expected a smaller "
                                       "--block-size or a larger --kv-cache-gb"),
    (f"simulate --block-size {10**30}", f"the opt-13b preset's 12.00 GiB of KV cache holds 15,728 "
                                        f"token slots, less than one block of --block-size="
                                        f"{10**30}; expected a smaller --block-size"),
    (f"bench simulate --sizes 5 --block-size {10**30}", "less than one block of --block-size="),
    ("simulate --request-rate 0", "--request-rate=0.0 must be > 0"),
    ("simulate --request-rate -1", "--request-rate=-1.0 must be > 0"),
    ("simulate --request-rate fast", "argument --request-rate: invalid float value: 'fast'"),
    ("simulate --block-size 0", "--block-size=0 must be >= 1"),
    ("simulate --n 0", "--n=0 must be >= 1"),
    ("simulate --beam-width 0", "--beam-width=0 must be >= 1"),
    ("simulate --n 2 --beam-width 2", "argument --beam-width: not allowed with argument --n"),
    ("simulate --max-num-seqs 0", "--max-num-seqs=0 must be >= 1"),
    ("simulate --max-num-batched-tokens 0", "--max-num-batched-tokens=0 must be >= 1"),
    ("simulate --max-num-batched-tokens 1", "--max-num-batched-tokens=1 must be >= "
                                            "max_model_len=2048, a prompt's step, unless "
                                            "--chunked-prefill"),
    ("simulate --sharing prefix", "--sharing=prefix is how the samples of a request share its "
                                  "prompt, and --n=1 (beam search forks its beams); expected "
                                  "--n=2 or more"),
    ("simulate --kv-cache-gb 1e-6 --policy orca-max", "--kv-cache-gb=1e-06 holds no token slot; "
                                                      "expected a larger --kv-cache-gb"),
    ("bench simulate --sizes 5 --policy orca-max --block-size 32", "--policy=orca-max reserves "
     "one contiguous region per request and would ignore --block-size=32"),
    ("simulate --seed -1", "--seed=-1 must be >= 0"),
    ("simulate --policy nope", "argument --policy: invalid choice: 'nope'"),
    ("simulate --sharing nope", "argument --sharing: invalid choice: 'nope'"),
    ("simulate --preemption nope", "argument --preemption: invalid choice: 'nope'"),
    ("simulate --policy orca-max --n 2", "--policy=orca-max cannot share memory between "
                                         "sequences: --n=2 / --beam-width=1 need --policy=paged"),
    ("simulate --policy orca-max --prefix-caching", "--policy=orca-max reserves one contiguous "
                                                   "region per request and would ignore "
                                                   "--prefix-caching"),
    ("simulate --policy orca-oracle --block-size 32", "would ignore --block-size=32"),
    ("simulate --policy orca-pow2 --preemption swap", "would ignore --preemption=swap"),
    ("simulate --workload {missing}", "does not exist; expected an existing file (or one of "
                                      "alpaca, sharegpt)"),
    ("simulate --workload {dir}", "is a directory; expected a file"),
    ("simulate --workload {binary}", "is not UTF-8 text"),
    ("simulate --workload {garbage}", ":1: not valid JSON"),
    ("simulate --workload {nested}", "nests too deeply to be read"),
    ("simulate --workload {array}", ":1: expected a JSON object, got list"),
    ("simulate --workload {no_output}", ":1: missing field 'output_len'"),
    ("simulate --workload {empty}", "holds no requests"),
    ("simulate --workload {negative}", "field 'prompt_len' = -1 must be an int >= 1"),
    ("simulate --workload {nan_arrival}", "field 'arrival_s' = nan must be a number >= 0"),
    ("simulate --workload {too_long}", "leaves no room to generate"),
    ("simulate --workload {timed} --request-rate 5", "gives each request's arrival_s: "
                                                     "--request-rate=5.0 would not be used"),
    ("simulate --json {missing_dir}/out.json", "is in a folder that does not exist"),
    ("simulate --json {dir}", "is a directory; expected a file name to write"),
    ("simulate --num-requests 5 --json /dev/full", "--json='/dev/full' cannot be written"),
    ("simulate --workload /dev/null", "--workload='/dev/null' is not a regular file"),
    ("simulate --num-requests 5 --json /proc/version", "--json='/proc/version' cannot be written"),
    ("simulate --workload {too_long} --model llama-3-8b --json {too_long}", "is the --workload "
     "trace, which the report would overwrite; expected another file name"),
    # experiment
    ("experiment 0", "argument number: invalid choice: 0"),
    ("experiment 6", "argument number: invalid choice: 6"),
    ("experiment x", "argument number: invalid int value: 'x'"),
    ("experiment 1 --num-requests 0", "--num-requests=0 must be >= 1"),
    ("experiment 1 --num-requests -3", "--num-requests=-3 must be >= 1"),
    (f"experiment 2 --num-requests {BIG}", f"--num-requests={BIG} x 6 sequences would need"),
    ("experiment 1 --seed -2", "--seed=-2 must be >= 0"),
    ("experiment 1 --json {missing_dir}/x.json", "is in a folder that does not exist"),
    # factcheck
    ("factcheck --seed -1", "--seed=-1 must be >= 0"),
    ("factcheck --json {missing_dir}/x.json", "is in a folder that does not exist"),
    ("factcheck --json {dir}", "is a directory; expected a file name to write"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_table(CASES, tmp_path_factory)


@pytest.mark.parametrize("line, fragment", CASES, ids=ids(CASES))
def test_bad_input_is_one_clear_line(results, line, fragment):
    check_one_clear_line(results, line, fragment, CASES)
