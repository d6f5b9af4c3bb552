"""The layout is part of the lesson: stages in reading order, imports that only look back.

Checks, against the one map in ``minipaged/__init__.py`` (``READING_ORDER``):
  * a core module imports only modules that come before it in the reading order (and
    ``_checks``); the core never imports ``sim/``, ``cuda/``, ``model/`` or ``kit/``; ``sim``,
    ``cuda``, ``model`` and ``kit`` follow in that order;
  * every core module's docstring says ``Read next: ``<the next module>``, so the links form one
    path through the core;
  * the package docstring and the README's course map list the core modules in that order;
  * no core file is over 300 lines, and neither the core path nor the package grows (their
    budgets are 2,700 and 12,000 lines);
  * no package, lesson, exercise or test file is over 300 lines.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import minipaged

PKG = Path(minipaged.__file__).resolve().parent
ROOT = PKG.parent
ORDER = list(minipaged.READING_ORDER)
LATER = ["sim", "cuda", "model", "kit"]  # after the core, in this order


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["minipaged", *parts])


def rank(name: str) -> tuple[int, int] | None:
    """(0, i) for the i-th core module, (1, j) for the j-th later area, None if exempt."""
    rel = name.removeprefix("minipaged").lstrip(".")
    if rel in ("", "_checks"):
        return None
    path = rel.replace(".", "/") + ".py"
    if path in ORDER:
        return (0, ORDER.index(path))
    top = rel.split(".")[0]
    if top in LATER:
        return (1, LATER.index(top))
    return None  # a package __init__ of a stage, or a re-export shim of an old path


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):  # function-level (lazy) imports count too
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            for a in node.names:  # "from minipaged.paged import cache_ops"
                names.add(f"{node.module}.{a.name}")
    return {n for n in names if n == "minipaged" or n.startswith("minipaged.")}


def resolve(name: str) -> str | None:
    """The module file a dotted name refers to (a package resolves to its __init__)."""
    rel = name.removeprefix("minipaged").lstrip(".").replace(".", "/")
    for cand in (PKG / f"{rel}.py", PKG / rel / "__init__.py"):
        if rel and cand.exists():
            return module_name(cand)
    return None


def test_reading_order_names_real_files():
    assert len(ORDER) == len(set(ORDER))
    for rel in ORDER:
        assert (PKG / rel).is_file(), rel


def test_imports_only_look_back():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        me = rank(module_name(path))
        if me is None:
            continue
        for name in imported_modules(path):
            target = resolve(name)
            if target is None:
                continue
            other = rank(target)
            if other is None:
                continue
            if other > me or (other == me and me[0] == 0):
                bad.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not bad, "imports that look forward:\n" + "\n".join(bad)


def read_next(path: Path) -> str | None:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    m = re.search(r"Read next:\s*``([^`]+)``", doc)
    return m.group(1) if m else None


@pytest.mark.parametrize("i", range(len(ORDER)))
def test_read_next_links_form_one_path(i):
    want = ORDER[i + 1] if i + 1 < len(ORDER) else minipaged.READ_AFTER_CORE
    assert read_next(PKG / ORDER[i]) == want, (
        f"{ORDER[i]}: its docstring must say Read next: ``{want}``")


def positions(text: str) -> list[str]:
    """The core modules in the order a text first mentions them."""
    found = {rel: text.find(rel) for rel in ORDER if rel in text}
    return sorted(found, key=found.get)


def test_package_map_and_readme_follow_the_order():
    assert positions(minipaged.__doc__) == ORDER
    readme = (ROOT / "README.md").read_text()
    course = readme[readme.index("## The course"):]
    course = course[:course.index("\n## ", 3)]
    assert positions(course) == ORDER


def test_core_budgets():
    lines = {rel: len((PKG / rel).read_text().splitlines()) for rel in ORDER}
    lines["_checks.py"] = len((PKG / "_checks.py").read_text().splitlines())
    too_long = {rel: n for rel, n in lines.items() if n > 300}
    assert not too_long, f"core files over 300 lines: {too_long}"
    # The design budget for the core path is 2,700 lines; it is not met yet (the closing notes
    # report the figure). Until it is, this ratchet keeps the core from growing. Its history:
    # 3,030, then 3,070 for the checks of a bad step result and a bad id (a failed
    # Scheduler.update had already changed sequences); 3,048 when the buddy allocator's slow
    # oracle moved to tests/invariants.py; 3,096 for the checks of BlockManager.usage's
    # final_lens (a float was truncated), flags that must be bools ('no' was True; 14 lines are
    # two imports that ruff wraps one name per line), sizes below 2**31 (int32 block ids;
    # 10**30 blocks was a bare OverflowError), dtypes and seq-id groups that name the argument;
    # 3,100 for the same in can_swap_out/in, CPUBlockPool's dtype and ContiguousKVCache's ids;
    # 3,109 for cache_ops.check_scatter, reshape_and_cache's checks as one function that the CUDA
    # launcher runs too (it had its own copy, in other words), and a non-array key refused as
    # check_caches refuses a non-array cache; 3,113 for block_manager.pad_tables, the padding of
    # BlockManager.block_tables that the model's runner wrote again (7 lines leave runner.py);
    # 3,086 when checks made twice on one call path were made once (allocate_many says what the
    # blocks are for), unused members went and timing history left the docstrings; 3,092 for
    # _checks.refuse_unused, the one wording of a refusal of ignored settings, which the
    # sampling parameters, the pool, SimConfig and the command line had each written; 3,107 for
    # a Scheduler that refuses a second schedule() before update(), samples that empty or
    # overgrow a group (dropping every beam freed them, then raised), finish_seq mid-step, and
    # stores NumPy tokens as ints; ragged tables named, block_size and pad within int32; 3,111
    # when the contiguous policies' usage took the next request's prompt length (Pow2 sizes the
    # region by it; a prompt of 1 overstated it); 3,121 when the prefix cache counted computed
    # tokens, not blocks, and refused append_slot and fork before a prompt's K/V are computed
    # (the block the append filled was cached over tokens with no K/V, and a prompt hit it);
    # 3,135 for _checks.check_id_list, which block_tables and can_append_slots now share with
    # swapping (a string read as a list of one-letter ids; 7 lines are an import ruff wraps),
    # an empty list read as an empty int array, and a scheduler clock that never goes back.
    assert sum(lines.values()) <= 3135, f"core path is {sum(lines.values())} lines (> 3,135)"


def test_no_python_file_or_kernel_in_the_package_is_over_300_lines():
    # One concept per file: a module or kernel source that outgrows 300 lines is split by topic.
    # (The CPU emulation harness, cuda/emu/, is a tool and is not counted.)
    sources = [*PKG.rglob("*.py"), *(PKG / "cuda").glob("*.cu"), *(PKG / "cuda").glob("*.cuh")]
    lines = {str(p.relative_to(PKG)): len(p.read_text().splitlines()) for p in sources}
    too_long = {rel: n for rel, n in lines.items() if n > 300}
    assert not too_long, f"package files over 300 lines: {too_long}"


def test_no_lesson_exercise_or_test_file_is_over_300_lines():
    # The same rule for what a learner reads beside the package: lessons, exercises (and their
    # solutions) and the tests, which are split by topic too. Snapshots are data, not read.
    sources = [*(ROOT / "lessons").glob("*.py"), *(ROOT / "exercises").rglob("*.py"),
               *(ROOT / "tests").rglob("*.py")]
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in sources}
    too_long = {rel: n for rel, n in lines.items() if n > 300}
    assert not too_long, f"files over 300 lines: {too_long}"


def test_package_does_not_grow():
    # The design budget for the whole package is 12,000 lines of source (the CPU emulation
    # harness, cuda/emu/, not counted). It is not met: the teaching kit alone (minipaged/kit/) is
    # about 9,400 lines, and the closing notes ask whether to cut its content or count it apart.
    # Until that is decided, this ratchet keeps the package from growing: 17,930 lines of .py,
    # .cu and .cuh files; 17,961 when SimConfig (now sim/config.py) took over the checks that
    # the command line made a second time in its flags' words (common.flag_words rewords
    # SimConfig's own); SimConfig now refuses a KV budget holding no block (simulate() refused it
    # later, naming num_slots) and sharing='prefix' with n=1 (which ran) when it is made; 17,995
    # for refusals of what had given a wrong answer or lost data (an --out its report would
    # overwrite, a --json that is the input trace or cannot be written, block ids an
    # --entry-bytes cannot hold) and no KV usage printed as 0% for a run too short to sample it;
    # 18,001 for lesson 09's output without transformers' progress bar; 18,180: 179 for grader
    # cases that catch wrong solutions which passed every case; 18,183 for simulate's title
    # (the requests --sharing=prefix runs) and experiment's progress display; 18,351: 168 for
    # flags that went unused and are now refused (common.refuse_unused: sampling flags under
    # greedy decoding or beam search, bench generate --model's --max-tokens and --repeats, the
    # arguments of --list and --glossary, check --solution with a path), a --max-model-len above
    # the model's positions (refused as vLLM refuses it), messages in flag words (PROMPT,
    # --backend, --svg, beams on a long-context model) and the exit statuses in one place;
    # 18,365 for a --request-rate refused with a timed trace, rates printed to 3 significant
    # digits where 0 decimals said 0, and a clear error for an experiment's run too short to
    # sample; 18,374 for a drill whose batch fits its cache, the beam figure drawn in
    # BeamSearch's order (free, then fork) and the preempt scene's mixed step said so; 18,380
    # when the kernels' comments said which version is the online walk, which parts of v1 are
    # vLLM's design and where 32-byte sectors hold; 18,426 when SimConfig and the workload
    # functions checked what reached NumPy or a slice unchecked (request_rate, seed,
    # max_model_len, a trace's num_requests), refused a rate a timed trace ignores, n with
    # beam_width, and an Orca budget below one region, and stored NumPy ints as ints; 18,535:
    # 109 for the engine's checks: sampling safe at any temperature (the largest logit
    # subtracted before dividing: 1e-320 overflowed and picked '~'), SamplingParams refusing
    # what its decoding ignores (which generate's flags now rely on), LLM refusing a pool over
    # half of this machine's memory by the arguments given (taking over generate's copy),
    # num_blocks with kv_cache_gb, swap without a CPU pool, a model or tokenizer that is none,
    # n samples with prefix caching that memory cannot hold, and odd return_logits, stop and
    # arrival_steps; 18,540 when those refusals of ignored settings took one wording
    # (_checks.refuse_unused); 18,555 for the core's 15 of the scheduler's and tables' checks;
    # 18,560 when ContiguousPolicy.usage sized the next region by its prompt too; 18,570 for
    # the prefix cache's refusal of an append or fork before the prompt's K/V are computed;
    # 18,584 for the core's check_id_list, empty int lists and a clock that never goes back;
    # 18,620: 36 for grader cases that catch 14 more wrong solutions which passed every case;
    # 18,632 for command-line messages that name only flags the user typed, a bench simulate
    # title without blocks for Orca, train's report path checked before training, and check's
    # missing exercise said on stderr; 18,644 when bench kernel left out, with a note, a
    # single-pass version whose logits do not fit in shared memory (it stopped the run);
    # 18,660 for the old minipaged.paged_attention path made callable (importing it put the
    # module where the top-level function was); 18,665 when present --build-figures removed only
    # the figures its last manifest lists (it deleted every .svg and .txt of --figures-dir);
    # 18,715: 50 for grader cases that catch 19 more wrong solutions which passed every case;
    # 18,721 for cuda.checks.fits_smem, the shared-memory rule that choose_version and bench
    # kernel had each written out.
    sources = [p for p in (*PKG.rglob("*.py"), *PKG.rglob("*.cu"), *PKG.rglob("*.cuh"))
               if p.relative_to(PKG).parts[:2] != ("cuda", "emu")]
    total = sum(len(p.read_text().splitlines()) for p in sources)
    assert total <= 18721, f"the package is {total} lines (> 18,721)"
