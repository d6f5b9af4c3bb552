"""Bad command lines: each one gets one clear line on stderr and exit status 2, never a traceback.

A fixed table of bad inputs, every command, each with the fragment of the message it must print
(which names the argument, the value and what was expected). Each line runs in a subprocess
with a timeout (a hang fails) and an address-space limit of 16 GiB (so "would need about N of
memory" refusals do not depend on the machine, and a size check that forgot to refuse cannot
eat the machine). The table grows with every command and every bad input found.

Left out, until the scheduler fix for them lands: the pool sizes on which ``generate`` and
``simulate`` with ``--preemption swap`` never finish (a swapped group that can never come
back), e.g. ``generate ... --n 3 --num-blocks 3 --block-size 32 --preemption swap``.
"""

from __future__ import annotations

import os
import resource
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from capabilities import require

ROOT = Path(__file__).resolve().parent.parent
DECK = "slides/pagedattention.md"
BIG = 10**12

# (command line after `minipaged`, a fragment its error message must contain). {name} is a file
# made by the `files` fixture below.
CASES: list[tuple[str, str]] = [
    # the command itself
    ("", "the following arguments are required: COMMAND"),
    ("nope", "invalid choice: 'nope'"),
    ("demo --bogus", "minipaged demo: unrecognized arguments: --bogus"),
    ("bench attention --bogus 1", "minipaged bench attention: unrecognized arguments: --bogus 1"),
    # demo
    ("demo nope", "scene='nope' is not a scene"),
    ("demo --width 20", "--width=20 must be >= 60 and <= 500"),
    ("demo --width 100000", "--width=100000 must be >= 60 and <= 500"),
    ("demo --width abc", "argument --width: invalid int value: 'abc'"),
    ("demo --speed 0", "--speed=0.0 must be > 0"),
    ("demo --speed nan", "--speed=nan must be a finite number > 0"),
    ("demo --seed -1", "--seed=-1 must be >= 0"),
    ("demo paging --svg {file}", "is a file; expected a directory"),
    ("demo paging --html {file}", "is a file; expected a directory"),
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
    ("simulate --max-num-batched-tokens 1", "--max-num-batched-tokens=1 is below the 2048 "
                                            "positions of opt-13b: without --chunked-prefill a "
                                            "whole prompt is one step; expected at least 2048"),
    ("simulate --sharing prefix", "--sharing=prefix is how the --n samples of a request share "
                                  "its prompt, and --n is 1"),
    ("simulate --seed -1", "--seed=-1 must be >= 0"),
    ("simulate --policy nope", "argument --policy: invalid choice: 'nope'"),
    ("simulate --sharing nope", "argument --sharing: invalid choice: 'nope'"),
    ("simulate --preemption nope", "argument --preemption: invalid choice: 'nope'"),
    ("simulate --policy orca-max --n 2", "policy='orca-max' cannot share memory"),
    ("simulate --policy orca-max --prefix-caching", "would ignore enable_prefix_caching=True"),
    ("simulate --policy orca-oracle --block-size 32", "would ignore block_size=32"),
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
    ("simulate --json {missing_dir}/out.json", "is in a folder that does not exist"),
    ("simulate --json {dir}", "is a directory; expected a file name to write"),
    ("simulate --num-requests 5 --json /dev/full", "--json='/dev/full' cannot be written"),
    ("simulate --workload /dev/null", "--workload='/dev/null' is not a regular file"),
    # an empty path is not the current directory
    ("simulate --json ''", "--json='' is empty; expected a path"),
    ("simulate --workload ''", "--workload='' is empty; expected a path"),
    ("generate x --checkpoint ''", "--checkpoint='' is empty; expected a path"),
    ("train --out ''", "--out='' is empty; expected a path"),
    ("present ''", "deck='' is empty; expected a path"),
    ("demo paging --svg ''", "--svg='' is empty; expected a path"),
    ("gpu-check --out ''", "--out='' is empty; expected a path"),
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
    # bench
    ("bench", "the following arguments are required: NAME"),
    ("bench nope", "invalid choice: 'nope'"),
    ("bench allocator --requests 0", "--requests=0 must be >= 1"),
    ("bench allocator --chunk 0", "--chunk=0 must be >= 1"),
    ("bench allocator --num-blocks 100000000", "--num-blocks=100000000 would need about"),
    ("bench allocator --num-blocks 1", "does not fit in an empty cache; expected a larger "
                                       "--num-blocks"),
    ("bench attention --heads 6 --kv-heads 4", "--heads=6 must be a multiple of --kv-heads=4"),
    ("bench attention --contexts 0", "--contexts=0 must be >= 1"),
    ("bench attention --seqs 100000 --contexts 1000000", "would need about"),
    ("bench attention --block-size 100000 --contexts 8", "(in blocks of --block-size=100000) "
                                                         "x --kv-heads=8"),
    ("bench attention --dtype int8", "argument --dtype: invalid choice: 'int8'"),
    ("bench attention --repeats 0", "--repeats=0 must be >= 1"),
    ("bench kernel --backend cpu --heads 6 --kv-heads 4", "--heads=6 must be a multiple of"),
    ("bench kernel --head-size 96", "argument --head-size: invalid choice: 96"),
    ("bench kernel --backend tpu", "argument --backend: invalid choice: 'tpu'"),
    ("bench kernel --backend cpu --seqs 100000 --contexts 1000000", "would need about"),
    # --quick gives defaults only to what was not given; what was given is checked
    (f"bench allocator --requests {BIG} --quick", f"--requests={BIG} and --num-blocks=2048 "
                                                  "would need about"),
    ("bench attention --heads 3 --kv-heads 2 --quick", "--heads=3 must be a multiple of "
                                                       "--kv-heads=2"),
    (f"bench attention --seqs {10**30} --quick", f"--seqs={10**30} x --contexts=256 (in blocks"),
    ("bench kernel --backend cpu --heads 3 --kv-heads 2 --quick", "--heads=3 must be a "
                                                                  "multiple of --kv-heads=2"),
    (f"bench kernel --backend cpu --seqs {10**30} --quick", f"--seqs={10**30} x --contexts=64"),
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
    # generate and train (the model: torch)
    ("generate", "the following arguments are required: PROMPT"),
    ("generate é", "is not a printable ASCII character"),
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
    ("generate x --n 300", "PROMPT 1 with --n=300: 300 sequence(s) of up to 81 tokens do not "
                           "fit, even alone, in the pool's 256 blocks of --block-size=16 (the "
                           "default); expected a larger --num-blocks or --kv-cache-gb, or a "
                           "smaller --max-tokens or --n"),
    ("generate x --beam-width 300 --kv-cache-gb 0.001", "PROMPT 1 with --beam-width=300: 300 "
                                                        "sequence(s)"),
    (f"generate x --n {10**30}", f"1 PROMPT(s) x --n={10**30} sequences would need about"),
    (f"generate x --beam-width {10**30}", f"x --beam-width={10**30} sequences would need about"),
    (f"generate x --n {10**30} --prefix-caching", f"x --n={10**30} sequences would need about"),
    (f"generate x --n {10**30} --reference", f"x --n={10**30} sequences would need about"),
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
    ("generate x --block-size 0", "--block-size=0 must be >= 1"),
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
    ("train --warmup 3 --steps 2 --out {dir}/x.pt", "--warmup=3 is longer than --steps=2: the "
                                                    "learning rate would never reach its peak"),
    # check
    ("check 99", "there is no exercise '99'"),
    ("check nope", "is neither a number nor a .py file"),
    ("check 4 --timeout -1", "--timeout=-1.0 must be >= 0"),
    ("check 4 --timeout nan", "--timeout=nan must be a finite number >= 0"),
    ("check {missing_py}", "does not exist"),
    ("check ''", "exercise '' is empty; expected a number or a .py file"),
    ("check {dir}", "is a directory; expected a .py file"),
    ("check 4 --timeout 1e30", "--timeout=1e+30 must be >= 0 and <= 86400"),
    ("demo --speed 1e30", "--speed=1e+30 must be > 0 and <= 3600"),
    ("bench attention --repeats 100000", "--repeats=100000 must be >= 1 and <= 1000"),
    ("bench allocator --chunk 10000000", "--chunk=10000000 must be >= 1 and <= 1e+06"),
    ("generate x --block-size 1000000", "the default 256 blocks x --block-size=1000000 (the KV "
                                        "pool) would need about"),
    ("check {binary_py}", "has no EXERCISE"),
    # quiz
    ("quiz --only nope", "--only='nope' names no drill"),
    ("quiz --only 0", "--only='0' names no drill"),
    ("quiz --num-requests 0", "--num-requests=0 must be >= 1"),
    (f"quiz --num-requests {BIG}", f"--num-requests={BIG} x 4 sequences would need about"),
    ("quiz --seed -1", "--seed=-1 must be >= 0"),
    # present
    ("present", "name a deck"),
    ("present {missing}", "does not exist; expected an existing file"),
    ("present {dir}", "is a directory; expected a file"),
    ("present {binary}", "is not UTF-8 text"),
    ("present {empty}", "holds no slides"),
    ("present {unclosed}", "front matter (starting with ---) is never closed"),
    (f"present {DECK} --slide 0", "--slide=0 must be >= 1"),
    (f"present {DECK} --slide 999", "--slide 999 is outside 1.."),
    ("present --check-figures --figures-dir {file}", "is a file; expected a directory"),
    ("present {bad_demo}", "slide 2's <!-- demo: nope --> names no demo scene; expected one of "
                           "fragmentation, paging"),
    ("present --check-figures --figures-dir {missing}", "does not exist; expected an existing "
                                                        "directory"),
    (f"present {DECK} --figures-dir {{missing}}", "goes with --build-figures or --check-figures"),
    ("present --build-figures --check-figures --figures-dir {dir}/figs",
     "argument --check-figures: not allowed with argument --build-figures"),
    (f"present {DECK} --build-figures --figures-dir {{dir}}/figs",
     f"--build-figures works on the figures, not on a deck: the deck '{DECK}' would not be used"),
    # gpu-check
    ("gpu-check --out {missing}/report.json", "is in a folder that does not exist"),
    ("gpu-check --out {dir}", "is a directory; expected a file name to write"),
    # generate --model (a Hugging Face directory)
    ("generate --model {missing} hi", "does not exist; expected an existing directory"),
    ("generate --model {file} hi", "is a file; expected a directory"),
    ("generate --kv-cache-gb 0 hi", "--kv-cache-gb=0.0 must be > 0"),
    ("generate --chat hi", "need --model"),
]
TORCH = ("generate", "train", "bench generate")


def _files(tmp: Path) -> dict[str, str]:
    texts = {
        "file": "just text\n", "garbage": "{not json\n", "nested": "[" * 100_000 + "]" * 100_000,
        "array": "[1, 2]\n", "no_output": '{"prompt_len": 5}\n', "empty": "",
        "negative": '{"prompt_len": -1, "output_len": 5}\n',
        "nan_arrival": '{"prompt_len": 5, "output_len": 5, "arrival_s": NaN}\n',
        "too_long": '{"prompt_len": 5000, "output_len": 5}\n', "unclosed": "---\nmarp: true\n# x\n",
        "bad_demo": "# one\n\n---\n\n# two\n<!-- demo: nope -->\n",
    }
    out = {}
    for name, text in texts.items():
        (tmp / f"{name}.txt").write_text(text)
        out[name] = str(tmp / f"{name}.txt")
    (tmp / "binary.bin").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01" * 64)
    (tmp / "binary.py").write_bytes(b"\xff\xfe\x00" * 64)
    (tmp / "adir").mkdir()
    out.update(binary=str(tmp / "binary.bin"), binary_py=str(tmp / "binary.py"),
               dir=str(tmp / "adir"), missing=str(tmp / "missing.jsonl"),
               missing_py=str(tmp / "missing.py"), missing_dir=str(tmp / "no" / "such"))
    return out


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (16 * 2**30, resource.RLIM_INFINITY))


def run_cli(argv: list[str], timeout: float = 120, env: dict | None = None,
            stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", "TERM": "dumb", **(env or {})}
    env.setdefault("MINIPAGED_TRACEBACK", "")
    return subprocess.run([sys.executable, "-m", "minipaged", *argv], cwd=ROOT, env=env,
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, preexec_fn=_limit_memory)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    return _files(tmp_path_factory.mktemp("bad_inputs"))


@pytest.fixture(scope="module")
def results(files) -> dict[str, subprocess.CompletedProcess | str]:
    """Every case of the table, two at a time (each is a separate interpreter)."""
    def one(line: str):
        try:
            return run_cli(shlex.split(line.format(**files)))
        except subprocess.TimeoutExpired:
            return "hang"
    lines = [line for line, _ in CASES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(lines, pool.map(one, lines)))


def test_the_table_covers_every_command():
    from minipaged.kit.cli import build_parser

    commands = {line.split()[0] for line, _ in CASES if line}
    names = set(build_parser()._subparsers._group_actions[0].choices)
    assert names <= commands, f"no bad input tried for {names - commands}"
    assert len(CASES) >= 80 and len({line for line, _ in CASES}) == len(CASES)


COMMANDS = {line.split()[0] for line, _ in CASES if line and line != "nope"}


@pytest.mark.parametrize("line, fragment", CASES, ids=[line or "(nothing)" for line, _ in CASES])
def test_bad_input_is_one_clear_line(results, line, fragment):
    if line.startswith(TORCH) and line not in ("generate", "bench generate"):
        require("torch")
    out = results[line]
    assert out != "hang", f"minipaged {line} did not finish"
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-3000:]
    assert out.returncode == 2, (out.returncode, out.stdout[-1000:], out.stderr[-1000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipaged"), out.stderr
    assert fragment in lines[0], lines[0]
    command = line.split()[0] if line else ""
    if command in COMMANDS:  # the error names the command it is about
        assert lines[0].startswith(f"minipaged {command}"), lines[0]


def test_the_timeout_limit_agrees_with_the_grader():
    from minipaged.kit.cli import teaching
    from minipaged.kit.grader.core import MAX_TIMEOUT_S

    assert teaching.MAX_TIMEOUT_S == MAX_TIMEOUT_S


@pytest.mark.parametrize("top", ["import sys\nsys.exit(0)\n", "raise SystemExit(3)\n"])
def test_a_learners_file_that_exits_is_graded_as_not_loading(tmp_path, top):
    """sys.exit() at the top of a learner's file must not end the grader with status 0."""
    f = tmp_path / "mine.py"
    f.write_text(f'EXERCISE = "04_block_table"\n{top}')
    out = run_cli(["check", str(f)], timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr
    assert "raised SystemExit" in " ".join(out.stdout.split())


def test_a_timeout_too_short_for_the_import_is_a_result_not_a_traceback():
    out = run_cli(["check", "6", "--timeout", "0.000001"], timeout=60)
    assert "Traceback" not in out.stdout + out.stderr, out.stderr[-2000:]
    assert out.returncode == 1, (out.stdout[-500:], out.stderr[-500:])


def test_an_endless_loop_at_the_top_of_a_learners_file_times_out(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text('EXERCISE = "04_block_table"\nwhile True:\n    pass\n')
    out = run_cli(["check", str(f), "--timeout", "2"], timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr
    assert "stopped after 2 s" in " ".join(out.stdout.split())


@pytest.mark.parametrize("argv", [["kv-calc"], ["quiz", "--list"], ["demo", "paging"]])
def test_a_closed_pipe_is_one_line_too(argv):
    """`minipaged ... | head` once head has quit: stdout's reader is gone before the output."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = run_cli(argv, stdout=write)
    finally:
        os.close(write)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"minipaged {argv[0]}: the output pipe closed before the output ended"]


def test_no_compiler_for_the_cpu_harness_is_one_line(tmp_path):
    """The harness's own errors count as the user's: a CXX that is not there, and no library
    built before (an empty cache), gives one line naming the compiler it tried."""
    out = run_cli(["bench", "kernel", "--backend", "cpu", "--quick"],
                  env={"CXX": str(tmp_path / "no-such-g++"), "MINIPAGED_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipaged bench kernel: "), out.stderr
    assert "needs a C++20 compiler" in lines[0] and "no-such-g++" in lines[0]


def test_minipaged_traceback_shows_the_traceback():
    out = run_cli(["quiz", "--only", "nope"], env={"MINIPAGED_TRACEBACK": "1"})
    assert out.returncode == 1 and "Traceback" in out.stderr and "names no drill" in out.stderr


def test_help_shows_defaults_and_no_notes_for_code_readers():
    for argv in (["--help"], ["simulate", "--help"], ["kv-calc", "--help"],
                 ["factcheck", "--help"], ["present", "--help"], ["bench", "kernel", "--help"],
                 ["bench", "attention", "--help"], ["generate", "--help"], ["train", "--help"]):
        out = run_cli(argv)
        text = " ".join(out.stdout.split())
        assert out.returncode == 0, argv
        for leak in ("Read next", "Read before", "What it teaches", "What this teaches",
                     "issue ", "shared/"):
            assert leak not in text, (argv, leak)
        if argv != ["--help"]:
            assert "(default: " in text, argv
