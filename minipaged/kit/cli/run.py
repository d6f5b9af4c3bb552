"""What each ``minipaged`` subcommand does with its parsed arguments, and its ``--help`` text.

A runner checks what the parser cannot (sizes against the memory there is, files that must be
readable), then calls the package's plain functions and prints. A refusal is a ValueError
whose message names the argument, its value and what was expected; ``main`` prints it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import contextmanager

from minipaged._install import HF_EXTRA, TORCH_HINT  # the install hint, one text for every command

# ---- errors and sizes --------------------------------------------------------------------------


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions bad input causes. Errors of the package's own kinds count too, when the
    module that defines them was imported (a module never imported raised nothing)."""
    from minipaged._checks import OutOfBlocksError

    kinds: list[type[BaseException]] = [ValueError, TypeError, OSError, ArithmeticError,
                                        RecursionError, MemoryError, OutOfBlocksError]
    for module, name in (("minipaged.model.runner", "BackendUnavailableError"),
                         ("minipaged.cuda.cpu_build", "CompilerNotFoundError"),
                         ("minipaged.cuda.cpu_build", "BuildError")):
        if module in sys.modules:
            kinds.append(getattr(sys.modules[module], name))
    return tuple(kinds)


def describe(e: BaseException) -> str:
    """One line for an error: its message, or what the error means when it has none."""
    if isinstance(e, UnicodeDecodeError):
        return f"a file is not UTF-8 text (byte {e.start}: {e.reason})"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename!r}: {e.strerror}" if e.filename else e.strerror
    if isinstance(e, RecursionError):
        return "the input nests too deeply"
    if isinstance(e, MemoryError):
        return f"out of memory {e}".strip()
    return " ".join(str(e).split()) or type(e).__name__


def available_memory() -> int:
    """Bytes this process could still allocate: the system's available memory, capped by the
    process's address-space limit (``ulimit -v``) when one is set."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            avail = min(avail, soft)
    except (ImportError, OSError, ValueError):
        pass
    return avail


def refuse_if_too_big(what: str, need: float) -> None:
    """Refuse a run, before it allocates, whose memory would exceed half of what is available
    (the rest is for everything the estimate leaves out)."""
    from minipaged.kit.quiz import nbytes

    limit = available_memory() / 2
    if need > limit:
        raise ValueError(f"{what} would need about {nbytes(need)} of memory; at most "
                         f"{nbytes(limit)} (half of what is available) may be used")


# Measured here with /usr/bin/time (max RSS over runs of two sizes): the simulator holds about
# 95 bytes per paged block (135 with prefix caching) and about 7 KB per request of a ShareGPT
# workload that arrives all at once (its sequences, token ids and per-step records).
SIM_BYTES_PER_BLOCK = 150
SIM_BYTES_PER_REQUEST = 8_000


def check_sim_size(num_requests: int, samples: int = 1, *, model: str = "opt-13b",
                   kv_cache_gb: float | None = None, block_size: int | None = 16,
                   flag: str = "--num-requests") -> None:
    """Refuse a simulation too big for this machine (``block_size=None``: a contiguous policy,
    which keeps no per-block state)."""
    from minipaged.sim.memory import preset

    p = preset(model, kv_cache_gb=kv_cache_gb)
    blocks = 0 if block_size is None else p.num_blocks(block_size)
    what = f"{flag}={num_requests}" + (f" x {samples} sequences" if samples > 1 else "")
    if kv_cache_gb is not None:
        what += f" with --kv-cache-gb={kv_cache_gb:g} ({blocks:,} simulated blocks)"
    refuse_if_too_big(what, num_requests * samples * SIM_BYTES_PER_REQUEST
                      + blocks * SIM_BYTES_PER_BLOCK)


@contextmanager
def reading(flag: str, value: str):
    """Errors while reading the file an argument named become one line naming the argument."""
    try:
        yield
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag}={value!r} is not UTF-8 text (byte {e.start}); expected "
                         "a text file") from None
    except RecursionError:
        raise ValueError(f"{flag}={value!r} nests too deeply to be read") from None
    except OSError as e:
        raise ValueError(f"{flag}={value!r} cannot be read: {e.strerror or e}") from None


# ---- output helpers ----------------------------------------------------------------------------

def progress_bar(console, label: str):
    """A rich progress bar as a context manager yielding ``update(done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True, disable=not console.is_terminal) as prog:
            task = prog.add_task(label, total=None)
            yield lambda done, total: prog.update(task, completed=done, total=total)
    return bar()


def _jsonable(obj):
    """JSON objects have string keys (results keyed by block size or width), and strict JSON
    has no Infinity (an all-at-once request rate is written "inf")."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def write_json(console, path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_jsonable(obj), f, indent=2, sort_keys=True, default=str, allow_nan=False)
        f.write("\n")
    console.print(f"wrote {path}")


# ---- demo --------------------------------------------------------------------------------------

DEMO_HELP = """\
Watch a paged KV cache work, one step at a time. Scenes, in tour order:

  fragmentation  the same requests in a contiguous cache (max / pow2 / oracle reservations)
                 and in a paged cache, with the waste of each (vLLM paper Fig. 2)
  paging         block tables growing token by token; slot = block * block_size + offset
  fork           parallel sampling: forked sequences share blocks, copy-on-write on append
  beam           beam search: forking candidates and freeing dropped beams
  prefix         a shared system prompt: prefix-cache hits and LRU eviction
  cow-prefix     fork with the prefix cache on: full blocks shared by hash, the last one
                 by copy-on-write; a copy, once full, found by hash by another request
  preempt        a pool too small: swapping to a CPU pool and back, and recomputation
  attention      a query walking its block table; the output equals dense attention
  model          the tiny trained model generating through the paged engine: real text in
                 the blocks, two samples sharing the prompt, copy-on-write (needs torch)

Without SCENE, plays all scenes this checkout supports, in order (--list says which).
Keys: space or right arrow = next, a = autoplay on/off, q = quit. When stdout is not a
terminal the demo plays through without waiting and exits 0.
"""


def demo(args) -> int:
    from minipaged.kit import demo as player

    return player.run(args)


# ---- kv-calc, simulate, experiment, factcheck ---------------------------------------------------

KV_CALC_HELP = """\
How many tokens fit: KV bytes per token, token slots, blocks, and the block table's own size.

    KV bytes per token = 2 (K and V) x layers x KV heads x head size x bytes per element
    token slots        = KV cache bytes // KV bytes per token
    blocks             = token slots // block size
    block table bytes  = ceil(context / block size) x entry bytes, per request (vLLM: int32)

The opt-13b preset is the paper's setting (section 3, Table 1: about 12 GB of KV cache on one
A100-40GB, 800 KB per token, about 15.7K token slots; its "GB" is GiB). --layers, --kv-heads,
--head-size and --dtype-bytes replace the preset's values (a "custom" model).

Bytes are per GPU. --tp N shards the KV heads over N GPUs, max(1, KV heads // N) each, so
they replicate when N > KV heads (vLLM's rule, vllm/config/model.py get_num_kv_heads); the
budget of a preset sized by vLLM's rule is recomputed with 1/N of the weights per GPU.
--kv-dtype fp8 halves the bytes of fp16/bf16. deepseek-v2 caches one MLA latent per token and
layer, kv_lora_rank 512 + qk_rope_head_dim 64 elements, on every GPU (TP does not divide it).
"""


def kv_calc(args) -> int:
    from dataclasses import replace

    from rich.console import Console
    from rich.table import Table

    from minipaged.kit.quiz import nbytes
    from minipaged.sim.memory import kv_calc, kv_preset

    if args.kv_dtype is not None and args.dtype_bytes is not None:
        raise ValueError("--kv-dtype and --dtype-bytes both set the bytes per element: give one")
    p = kv_preset(args.model, kv_cache_gb=args.kv_cache_gb, tp=args.tp, kv_dtype=args.kv_dtype)
    if any(v is not None for v in (args.layers, args.kv_heads, args.head_size, args.dtype_bytes)):
        m = p.model                  # a custom model: the given values replace the preset's
        if m.is_mla and (args.kv_heads or args.head_size):
            raise ValueError(f"--kv-heads and --head-size do not change the KV of {m.name}: "
                             f"MLA caches one latent per token and layer")
        kv_heads = args.kv_heads or m.num_kv_heads      # (the parser refused 0 and below)
        heads = m.num_heads if m.num_heads % kv_heads == 0 else kv_heads
        m = replace(m, name=f"{m.name} (custom)", num_layers=args.layers or m.num_layers,
                    num_heads=heads, num_kv_heads=kv_heads, head_size=args.head_size or
                    m.head_size, dtype_bytes=args.dtype_bytes or m.dtype_bytes)
        p = replace(p, model=m)
    r = kv_calc(p, block_size=args.block_size, context_len=args.context_len,
                num_requests=args.num_requests, entry_bytes=args.entry_bytes)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    per_gpu = " (per GPU)" if r["tp"] > 1 else ""
    how = ((f"(kv_lora_rank + qk_rope_head_dim) x layers x {r['kv_dtype_bytes']} B (MLA)")
           if r["mla"] else f"2 x layers x {r['kv_heads_per_gpu']} KV heads{per_gpu} x "
           f"head_size x {r['kv_dtype_bytes']} B")
    t = Table(title=f"KV cache of {r['model']} on {r['gpu']}"
                    + (f", tensor parallel over {r['tp']} GPUs" if r["tp"] > 1 else ""))
    for col, justify in (("quantity", "left"), ("value", "right"), ("how", "left")):
        t.add_column(col, justify=justify)
    for row in (
        (f"KV bytes per token{per_gpu}", nbytes(r["kv_bytes_per_token"]), how),
        (f"KV cache budget{per_gpu}", nbytes(r["kv_cache_bytes"]), "preset or --kv-cache-gb"),
        ("token slots", f"{r['token_slots']:,}", "budget // bytes per token"),
        ("blocks", f"{r['num_blocks']:,}", f"slots // block_size ({r['block_size']})"),
        ("bytes per block", nbytes(r["block_bytes"]), "block_size x bytes per token"),
        ("blocks per request", f"{r['blocks_per_request']:,}",
         f"ceil(context {r['context_len']} / block_size)"),
        ("KV per request", nbytes(r["kv_bytes_per_request"]), "context x bytes per token"),
        ("block table per request", nbytes(r["block_table_bytes_per_request"]),
         f"blocks x {r['entry_bytes']} B per entry"),
        (f"block tables for {r['num_requests']:,} requests",
         nbytes(r["block_table_bytes_total"]), "per request x requests"),
        ("requests of that context that fit", f"{r['requests_that_fit']:,}", "slots // context"),
    ):
        t.add_row(*row)
    Console().print(t)
    return 0


SIM_HELP = """\
Simulate serving a workload with the real scheduler and KV cache managers (vLLM paper sections
4.5 and 6): requests arrive (Poisson, seeded), the scheduler batches them step by step over a
paged KV cache or an Orca-style contiguous one, and a roofline cost model turns each step into
time. Prints KV memory usage by category (the paper's Fig. 2), batch size, throughput and
normalized latency (end-to-end latency / output tokens). Same seed, same output.

examples:
  minipaged simulate --workload sharegpt --policy paged --num-requests 1000 --request-rate 2
  minipaged simulate --workload alpaca --policy paged --beam-width 4 --json out.json
  minipaged simulate --workload trace.jsonl --policy orca-oracle
"""

SUMMARY_ROWS = (
    ("token states (of KV memory)", lambda r: f"{100 * r.kv_usage['token']:.1f}%"),
    ("reserved", lambda r: f"{100 * r.kv_usage['reserved']:.1f}%"),
    ("internal fragmentation", lambda r: f"{100 * r.kv_usage['internal_fragmentation']:.1f}%"),
    ("external fragmentation", lambda r: f"{100 * r.kv_usage['external_fragmentation']:.1f}%"),
    ("free", lambda r: f"{100 * r.kv_usage['free']:.1f}%"),
    ("token states while queued", lambda r: "-" if r.kv_usage_saturated is None
     else f"{100 * r.kv_usage_saturated['token']:.1f}%"),
    ("avg batch size (seqs/decode step)", lambda r: f"{r.avg_batch_size:.1f}"),
    ("throughput (tokens/s)", lambda r: f"{r.throughput_tokens_per_s:.0f}"),
    ("throughput (requests/s)", lambda r: f"{r.throughput_requests_per_s:.3f}"),
    ("normalized latency (s/token)", lambda r: f"{r.normalized_latency_s_per_token:.4f}"),
    ("preemptions (swap / recompute)",
     lambda r: f"{r.num_preemptions} ({r.num_swapped_out} / {r.num_recomputed})"),
    ("memory saved by sharing", lambda r: "-" if r.memory_saving is None
     else f"{100 * r.memory_saving:.1f}%"),
    ("finished / rejected", lambda r: f"{r.num_finished} / {r.num_rejected}"),
    ("steps, simulated time", lambda r: f"{r.num_steps}, {r.sim_time_s:.1f} s"),
)


def simulate(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from minipaged.sim.simulator import SimConfig, simulate
    from minipaged.sim.workloads import WORKLOADS, load_jsonl

    num_requests = args.num_requests
    if args.workload not in WORKLOADS:       # a trace: read it once here, to blame it by name
        with reading("--workload", args.workload):
            num_requests = min(num_requests, len(load_jsonl(args.workload)))
    cfg = SimConfig(workload=args.workload, policy=args.policy, num_requests=args.num_requests,
                    request_rate=args.request_rate, seed=args.seed, block_size=args.block_size,
                    model=args.model, kv_cache_gb=args.kv_cache_gb, n=args.n,
                    beam_width=args.beam_width, sharing=args.sharing,
                    enable_prefix_caching=args.prefix_caching, preemption_mode=args.preemption,
                    chunked_prefill=args.chunked_prefill,
                    max_num_batched_tokens=args.max_num_batched_tokens,
                    max_num_seqs=args.max_num_seqs)
    check_sim_size(num_requests, max(args.n, args.beam_width), model=args.model,
                   kv_cache_gb=args.kv_cache_gb,
                   block_size=args.block_size if args.policy == "paged" else None)
    console = Console()
    with progress_bar(console, f"simulating {cfg.policy}") as update:
        r = simulate(cfg, progress=update)
    t = Table(title=f"{cfg.workload}, {cfg.num_requests} requests at {cfg.request_rate} req/s, "
                    f"seed {cfg.seed}")
    t.add_column("figure")
    t.add_column(cfg.policy, justify="right")
    for label, cell in SUMMARY_ROWS:
        t.add_row(label, cell(r))
    console.print(t)
    if r.num_rejected:
        console.print(f"{r.num_rejected} request(s) refused, the first because: "
                      f"{r.extra['first_rejection']}")
    if args.json:
        write_json(console, args.json, r.as_dict())
    return 0


EXPERIMENT_HELP = """\
Reproduce one of the vLLM paper's results with the project's scheduler and memory managers,
printing the paper's figure beside ours (minipaged/sim/experiments.py explains the differences):

    1  Fig. 2   where KV memory goes: orca-max / orca-pow2 / orca-oracle / paged on ShareGPT
    2  Fig. 15  memory saved by parallel sampling (n = 2, 4, 6) and beam search (k = 2, 4, 6)
    3  Fig. 12-13  the highest request rate each policy sustains, average batch size
    4  Fig. 18b block size 1..256: fragmentation, block-table bytes, blocks read, throughput
    5  Fig. 19  swap versus recompute under memory pressure, per block size

examples:
  minipaged experiment 1
  minipaged experiment 4 --quick --json block_size.json
"""


def experiment(args) -> int:
    from rich.console import Console

    from minipaged.sim import experiments

    check_sim_size(args.num_requests or 1000, 6)   # experiment 2 runs beams of width 6
    console = Console()
    res = experiments.run(args.number, num_requests=args.num_requests, seed=args.seed,
                          quick=args.quick, console=console)
    if args.json:
        write_json(console, args.json, res)
    return 0


FACTCHECK_HELP = """\
Fact-check the interview answer: a model answer to "explain vLLM's PagedAttention" that
candidates learn by heart. For each of its checkable claims, the package's own instruments (the
simulator, kv-calc's arithmetic, the real block managers) measure the figure, printed beside the
claim with a verdict:

    holds        what we measure (or the paper reports) agrees
    off          it disagrees: the right figure is given
    unsupported  neither the paper nor the code says so, and our measurements do not back it

Lesson 10 (lessons/10_factcheck.py) walks through the findings.
"""


def factcheck(args) -> int:
    from dataclasses import asdict

    from rich.console import Console

    from minipaged.kit.quiz import factcheck

    console = Console()
    with progress_bar(console, "checking claims") as update:
        findings = factcheck.run(quick=args.quick, seed=args.seed, progress=update)
    console.print(factcheck.table(findings))
    counts = {v: sum(f.verdict == v for f in findings) for v in factcheck.VERDICTS}
    console.print(f"{len(findings)} claims: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    if args.json:
        write_json(console, args.json, [asdict(f) for f in findings])
    return 0


# ---- generate, train ---------------------------------------------------------------------------

GENERATE_HELP = """\
The tiny model completing prompts through the paged KV cache.

Every prompt becomes a request; all of them run as one continuous batch through the scheduler,
and each prompt's completion is printed on one line, in prompt order (a newline inside a
completion is printed as \\n). --reference runs the plain generator (one sequence at a time,
a contiguous cache each) instead: the two must print the same thing for greedy decoding.

The shipped model was trained on one task, counting down ("count down from 42:"), so that its
answers can be checked; any printable ASCII prompt is accepted, but elsewhere it babbles.
"""

GENERATE_EXAMPLES = """\
examples:
  minipaged generate "count down from 42:"
  minipaged generate "count down from 9:" "count down from 23:" --block-size 4 --show-blocks
  minipaged generate "count down from 20:" --n 3 --temperature 0.8 --seed 1
  minipaged generate "count down from 12:" --beam-width 4
  minipaged generate "count down from 30:" "count down from 33:" --num-blocks 30 \\
      --block-size 4 --preemption swap      (a pool too small for both: watch the preemptions)
"""



def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _block_drawer(console):
    """An ``on_step`` callback that draws the block tables when a step changed them."""
    from rich.text import Text

    last: dict = {}

    def draw(stats) -> None:
        tables = stats.block_tables
        if tables == last.get("tables") and not stats.copies and not stats.preempted:
            return
        last["tables"] = {k: list(v) for k, v in tables.items()}
        head = Text(f"step {stats.step:3d}  prefill {stats.num_prefill_tokens:3d} tok  "
                    f"decode {stats.num_decodes:2d}  free blocks {stats.num_free_blocks}",
                    style="bold")
        for what, value, style in (("copy-on-write", stats.copies, "magenta"),
                                   ("preempted", stats.preempted, "red"),
                                   ("swapped in", stats.swapped_in, "yellow")):
            if value:
                head.append(f"  {what} {value}", style=style)
        console.print(head)
        for sid, table in sorted(tables.items()):
            line = Text(f"  seq {sid:3d} ")
            for b in table:
                line.append(f"[{b:3d}]", style=f"color({16 + (b * 37) % 200})")
            console.print(line)

    return draw


def _progress(console, every_s: float = 2.0):
    """An ``on_step`` callback: prefill and decode tokens/s over the last ``every_s`` seconds."""
    last = {"t": time.perf_counter(), "pre": 0, "dec": 0}

    def show(stats) -> None:
        last["pre"] += stats.num_prefill_tokens
        last["dec"] += stats.num_decodes
        dt = time.perf_counter() - last["t"]
        if dt >= every_s:
            console.print(f"[dim]step {stats.step}: prefill {last['pre'] / dt:,.0f} tok/s, "
                          f"decode {last['dec'] / dt:,.0f} tok/s, "
                          f"{stats.num_free_blocks} free blocks[/dim]")
            last.update(t=time.perf_counter(), pre=0, dec=0)

    return show


def _load_hf(args):
    """(model, tokenizer, prompts as token ids or text) for ``--model DIR``."""
    try:
        from minipaged.model.hf import load_hf

        model, tok = load_hf(args.model, max_seq_len=args.max_model_len)
    except ImportError as e:
        raise ValueError(f"--model needs {e.name}: from a checkout, {HF_EXTRA}") from None
    prompts = args.prompts
    if args.chat:   # the template writes the special tokens itself: encode without adding any
        prompts = [tok.encode(tok.chat_prompt(p), bos=False) for p in prompts]
    return model, tok, prompts


def generate(args) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ValueError(TORCH_HINT)
    import pickle

    import torch
    from rich.console import Console

    from minipaged.model.checkpoint import load_model
    from minipaged.model.sampling import SamplingParams

    torch.set_num_threads(1)
    err = Console(stderr=True)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_k=args.top_k, n=args.n, beam_width=args.beam_width,
                            seed=args.seed)
    tokenizer, prompts = None, args.prompts
    if args.model is not None:
        if args.checkpoint is not None:
            raise ValueError("--checkpoint is the tiny model's; it cannot go with --model")
        model, tokenizer, prompts = _load_hf(args)
    elif args.chat or args.max_model_len is not None:
        raise ValueError("--chat and --max-model-len need --model DIR")
    elif args.checkpoint is None:
        model = load_model()
    else:
        try:
            with reading("--checkpoint", args.checkpoint):
                model = load_model(args.checkpoint)
        except (pickle.UnpicklingError, RuntimeError, EOFError, KeyError) as e:
            raise ValueError(f"--checkpoint={args.checkpoint!r} is not a minipaged checkpoint "
                             f"({describe(e)})") from None
    t0 = time.perf_counter()
    if args.reference:
        from minipaged.model.reference import ReferenceGenerator

        outs = ReferenceGenerator(model, tokenizer=tokenizer).generate(prompts, params)
        summary = "reference generator (contiguous cache per sequence)"
    else:
        from minipaged.model.engine import LLM

        c = model.cfg
        pools = 2 if args.preemption == "swap" else 1       # the CPU pool mirrors the GPU one
        kv = (pools * 2 * c.n_layers * c.n_kv_heads * c.head_dim * args.block_size
              * next(model.parameters()).element_size())
        if args.num_blocks is not None:
            refuse_if_too_big(f"--num-blocks={args.num_blocks} x --block-size={args.block_size} "
                              "(the KV pool)", args.num_blocks * (kv + 2 * SIM_BYTES_PER_BLOCK))
        elif args.kv_cache_gb is not None:
            refuse_if_too_big(f"--kv-cache-gb={args.kv_cache_gb:g} (the KV pool)",
                              pools * args.kv_cache_gb * 2**30)
        llm = LLM(model, tokenizer=tokenizer, num_blocks=args.num_blocks,
                  block_size=args.block_size, kv_cache_gb=args.kv_cache_gb,
                  enable_prefix_caching=args.prefix_caching, preemption=args.preemption,
                  chunked_prefill=(args.chunked_prefill > 0) or None,
                  max_num_batched_tokens=args.chunked_prefill or None, backend=args.backend)
        show = [_progress(err)]
        if args.show_blocks:
            show.append(_block_drawer(err))
        llm.on_step = lambda stats: [f(stats) for f in show]
        outs = llm.generate(prompts, params)
        err.print(f"[dim]{llm.pool_note}[/dim]")
        summary = (f"paged engine: {llm.num_steps} steps, {llm.num_preemptions} preemptions, "
                   f"{llm.runner.num_blocks_copied} blocks copied on write, "
                   f"{llm.runner.num_blocks_swapped} swapped; pool back to "
                   f"{llm.manager.num_free_blocks}/{llm.num_blocks} free blocks")
    dt = time.perf_counter() - t0
    for prompt, o in zip(args.prompts, outs):
        texts = " || ".join(_escape(c.text) for c in o.outputs)
        sys.stdout.write(f"{_escape(prompt)} => {texts}\n")
    sys.stdout.flush()
    n_tok = sum(len(c.token_ids) for o in outs for c in o.outputs)
    err.print(f"[dim]{summary}; {n_tok} tokens in {dt:.2f} s[/dim]")
    return 0


TRAIN_HELP = """\
Train the tiny counting model that ships with the package (seeded; 5 to 15 minutes on one busy
CPU core) and write the checkpoint with a JSON report of its held-out score beside it. The
defaults are the settings of the shipped checkpoint (minipaged/model/train.py explains them).

examples:
  minipaged train                                  (rewrites the shipped checkpoint)
  minipaged train --steps 50 --out /tmp/x.pt       (a quick smoke run)
"""


def train(args) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ValueError(TORCH_HINT)
    from minipaged.model.train import TrainSettings, train

    train(TrainSettings(seed=args.seed, steps=args.steps, batch_size=args.batch_size,
                        lr=args.lr, warmup=args.warmup, weight_decay=args.weight_decay,
                        threads=args.threads, num_eval=args.num_eval), args.out)
    return 0


# ---- check, quiz, present ----------------------------------------------------------------------

CHECK_HELP = """\
Grade your answer to an exercise with hidden tests.

  minipaged check 6                      grades exercises/06_paged_gather.py
  minipaged check ~/work/my_gather.py    grades a copy anywhere (its EXERCISE line says which)
  minipaged check --list                 lists the exercises
  minipaged check 6 --solution           grades the reference solution (a spoiler)

Prints which cases pass, the first failing case with its inputs, expected and actual values,
and a hint. Exits 0 when every case passes, 1 otherwise, 2 when the argument names nothing.
"""


def check(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from minipaged.kit.grader import all_exercises, grade, resolve
    from minipaged.kit.grader.report import print_report

    console = Console()
    if args.list or not args.exercise:
        table = Table(title="exercises (minipaged check NUMBER)")
        for col, justify in (("#", "right"), ("file", "left"), ("topic", "left"),
                             ("cases", "right")):
            table.add_column(col, justify=justify)
        for ex in all_exercises().values():
            table.add_row(str(ex.number), f"exercises/{ex.name}.py", ex.title, str(len(ex.cases)))
        console.print(table)
        return 0 if args.list else 2
    exercise, path = resolve(args.exercise, solution=args.solution)
    result = grade(exercise, path, timeout_s=args.timeout)
    print_report(result, console)
    return 0 if result.passed else 1


QUIZ_HELP = """\
Interview drills: the interview answer's question (Chinese and English), its follow-ups and
pitfalls, and more questions a strong interviewer asks. Every number in an answer is computed
as it prints, by the calculator, the simulator and the managers, with the command that
reproduces it; where the interview answer is wrong, the drill says so (the same verdict as
`minipaged factcheck`). When stdout is not a terminal and --answers is not given, the
questions are printed as a worksheet and nothing waits for a key.

  minipaged quiz                 interactive: a key reveals each answer
  minipaged quiz --answers       print every question and answer
  minipaged quiz --only why-16   one drill (key or number)
  minipaged quiz --glossary      every key term in English and Chinese
"""


def quiz(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from minipaged.kit import quiz
    from minipaged.kit.quiz.glossary import glossary_table

    console = Console()
    if args.glossary:
        console.print(glossary_table())
        return 0
    if args.list:
        t = Table(title="interview drills (minipaged quiz --only KEY)")
        for col in ("#", "key", "source", "question"):
            t.add_column(col)
        for i, d in enumerate(quiz.DRILLS, 1):
            t.add_row(str(i), d.key, d.source, f"{d.zh}\n{d.en}")
        console.print(t)
        return 0
    drills = quiz.select(list(quiz.DRILLS), args.only)
    check_sim_size(args.num_requests, 4)           # the drills simulate beams of width 4
    ctx = quiz.Context(args.num_requests, args.seed)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    return quiz.run_quiz(drills, ctx, answers=args.answers, interactive=interactive,
                         console=console)


PRESENT_HELP = """\
A terminal presenter for the Marp deck: it pages through the slides (Marp's front matter
skipped), shows each image as the plain-text twin of its SVG (slides/figures/NAME.txt), shows
speaker notes (HTML comments) with n, and plays a live demo scene where a slide says
<!-- demo: SCENE -->.

Keys in a terminal: space / right / enter = next, b / left = back, n = notes on/off,
d = play the slide's demo scene, q = quit. When stdout is not a terminal every slide is
printed once, nothing waits, exit 0.

    minipaged present slides/pagedattention.md
    minipaged present slides/pagedattention.md --notes --slide 12
    minipaged present --build-figures      regenerate slides/figures/ (demo + simulator)
    minipaged present --check-figures      exit 1 if a committed figure is stale
"""


def present(args) -> int:
    from pathlib import Path

    from rich.console import Console

    from minipaged.kit import figures
    from minipaged.kit.present import present

    console = Console()
    out = Path(args.figures_dir) if args.figures_dir else figures.default_dir()
    if args.build_figures:
        with console.status("drawing figures..."):
            made = figures.build(out)
        console.print(f"wrote {len(made)} figures (.svg + .txt) and manifest.json to {out}")
        return 0
    if args.check_figures:
        bad = list(figures.stale(out))
        if bad:
            console.print(f"[red]stale or missing figures:[/] {', '.join(bad)}\n"
                          f"regenerate with: minipaged present --build-figures")
            return 1
        console.print("every figure is up to date")
        return 0
    if not args.deck:
        raise ValueError("name a deck, e.g. minipaged present slides/pagedattention.md")
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    with reading("deck", args.deck):
        return present(Path(args.deck), notes=args.notes, start=args.slide,
                       interactive=interactive, console=console)
