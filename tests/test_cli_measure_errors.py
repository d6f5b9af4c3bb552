"""Bad command lines of the measuring commands (bench, gpu-check): each one gets one clear line on
stderr and exit status 2, never a traceback (benchmarks that do not exist, sizes out of range or
too big for memory, heads that do not group, what --quick does not default, report paths that
cannot be written); and a C++ compiler that is not there, for the CPU harness, is one line too.
"""

from __future__ import annotations

import pytest
from cli_helpers import BIG, check_one_clear_line, ids, run_cli, run_table

# (command line after `minipaged`, a fragment its error message must contain). {name} is a file
# made by cli_helpers.run_table.
CASES: list[tuple[str, str]] = [
    # bench
    ("bench", "the following arguments are required: NAME"),
    ("bench nope", "invalid choice: 'nope'"),
    ("bench allocator --requests 0", "--requests=0 must be >= 1"),
    ("bench allocator --chunk 0", "--chunk=0 must be >= 1"),
    ("bench allocator --chunk 10000000", "--chunk=10000000 must be >= 1 and <= 1e+06"),
    ("bench allocator --num-blocks 100000000", "--num-blocks=100000000 would need about"),
    ("bench allocator --num-blocks 1", "does not fit in an empty cache; expected a larger "
                                       "--num-blocks"),
    ("bench attention --heads 6 --kv-heads 4", "--heads=6 must be a multiple of --kv-heads=4"),
    # a value the user did not type says where it came from
    ("bench attention --heads 3 --quick", "--heads=3 must be a multiple of --kv-heads=2 "
                                          "(--quick's default)"),
    ("bench kernel --heads 3", "--heads=3 must be a multiple of --kv-heads=8 (the default)"),
    ("bench generate --write-random-model {dir}/m --max-new 5",
     "--min-new=16 (the default) is above --max-new=5"),
    ("bench attention --contexts 0", "--contexts=0 must be >= 1"),
    ("bench attention --seqs 100000 --contexts 1000000", "would need about"),
    ("bench attention --block-size 100000 --contexts 8", "(in blocks of --block-size=100000) "
                                                         "x --kv-heads=8"),
    ("bench attention --dtype int8", "argument --dtype: invalid choice: 'int8'"),
    ("bench attention --repeats 0", "--repeats=0 must be >= 1"),
    ("bench attention --repeats 100000", "--repeats=100000 must be >= 1 and <= 1000"),
    ("bench kernel --backend cpu --heads 6 --kv-heads 4", "--heads=6 must be a multiple of"),
    ("bench kernel --head-size 96", "argument --head-size: invalid choice: 96"),
    ("bench kernel --backend tpu", "argument --backend: invalid choice: 'tpu'"),
    ("bench kernel --backend cpu --seqs 100000 --contexts 1000000", "would need about"),
    # --quick gives defaults only to what was not given; what was given is checked
    (f"bench allocator --requests {BIG} --quick", f"--requests={BIG} and --num-blocks=2048 "
                                                  "would need about"),
    ("bench attention --heads 3 --kv-heads 2 --quick", "--heads=3 must be a multiple of "
                                                       "--kv-heads=2"),
    (f"bench attention --seqs {10**30} --quick", f"--seqs={10**30} x --contexts=256 (--quick's "
                                                 "default) (in blocks"),
    ("bench attention --quick --contexts 1000000000", "--seqs=4 (--quick's default) x --contexts="
     "1000000000 (in blocks of --block-size=16) x --kv-heads=2 (--quick's default) x "
     "--head-size=32 (--quick's default) would need about"),
    ("bench kernel --backend cpu --heads 3 --kv-heads 2 --quick", "--heads=3 must be a "
                                                                  "multiple of --kv-heads=2"),
    (f"bench kernel --backend cpu --seqs {10**30} --quick", f"--seqs={10**30} x --contexts=64 "
                                                            "(--quick's default)"),
    ("bench kernel --heads 6 --kv-heads 4", "--heads=6 must be a multiple of --kv-heads=4"),
    ("bench simulate --sizes 0", "--sizes=0 must be >= 1"),
    (f"bench simulate --sizes 10 {BIG}", f"--sizes={BIG} would need about"),
    ("bench simulate --policy nope", "argument --policy: invalid choice: 'nope'"),
    ("bench generate --requests 0", "--requests=0 must be >= 1"),
    ("bench generate --max-tokens 0", "--max-tokens=0 must be >= 1"),
    ("bench generate --block-size 100000000", "--block-size=100000000 would need about"),
    ("bench generate --min-prompt 50 --max-prompt 10", "--min-prompt=50, --max-prompt=10 shape "
                                                       "the requests of --model DIR"),
    ("bench generate --min-new 50 --max-new 10", "--min-new=50, --max-new=10 shape the requests "
                                                 "of --model DIR"),
    # --model DIR runs once, on lengths of its own; it writes or names one model
    ("bench generate --model {dir} --max-tokens 2 --repeats 1000 --min-new 6 --max-new 6",
     "--model DIR runs each generator once, for output lengths drawn from --min-new to "
     "--max-new: --max-tokens=2, --repeats=1000 would not be used; expected --model DIR without "
     "them"),
    ("bench generate --write-random-model {dir}/m --repeats 2", "--write-random-model DIR runs "
                                                                "each generator once"),
    ("bench generate --model {dir} --write-random-model {dir}/m", "/m' writes the model that is "
                                                                  "then measured, and --model="),
    # gpu-check
    ("gpu-check --out {missing}/report.json", "is in a folder that does not exist"),
    ("gpu-check --out {dir}", "is a directory; expected a file name to write"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_table(CASES, tmp_path_factory)


@pytest.mark.parametrize("line, fragment", CASES, ids=ids(CASES))
def test_bad_input_is_one_clear_line(results, line, fragment):
    check_one_clear_line(results, line, fragment, CASES)


def test_no_compiler_for_the_cpu_harness_is_one_line(tmp_path):
    """The harness's own errors count as the user's: a CXX that is not there, and no library
    built before (an empty cache), gives one line naming the compiler it tried."""
    out = run_cli(["bench", "kernel", "--backend", "cpu", "--quick"],
                  env={"CXX": str(tmp_path / "no-such-g++"), "MINIPAGED_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipaged bench kernel: "), out.stderr
    assert "needs a C++20 compiler" in lines[0] and "no-such-g++" in lines[0]
