"""The interview drills and the glossary.

What is promised, and tested here:
- the interview answer's question, its three follow-ups and three pitfalls keep their Chinese
  wording beside an English one (from the project's own data, ``answer.py``), and at least ten
  more interviewer questions follow;
- every answer is computed by the package when it is shown (a patched package function changes
  the printed figure), lists commands that reproduce it, and carries the fact-check's own
  verdict where it covers a claim of the interview answer;
- ``--answers`` prints everything; a non-terminal never waits for a key; in a terminal a key
  reveals each answer and ``q`` quits;
- the glossary names every key term in English and Chinese.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from minipaged.kit import quiz
from minipaged.kit.quiz import (
    DRILLS,
    Context,
    answer_renderable,
    drills_answer,
    glossary,
    run_quiz,
    select,
)
from minipaged.kit.quiz import answer as interview

ROOT = Path(__file__).resolve().parent.parent
CJK = re.compile(r"[\u4e00-\u9fff]")
SMALL = Context(num_requests=30, seed=0)   # small simulations: the answers' shape, not figures


def _cli(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="120", TERM="dumb")
    return subprocess.run([sys.executable, "-m", "minipaged", "quiz", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def _text(renderable) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_drill_inventory():
    keys = [d.key for d in DRILLS]
    assert len(set(keys)) == len(keys)
    assert keys[:4] == ["question", "follow-up-1", "follow-up-2", "follow-up-3"]
    assert sum(d.source.startswith("pitfall") for d in DRILLS) >= 3
    assert sum(d.source == "interviewer" for d in DRILLS) >= 10
    for d in DRILLS:
        assert CJK.search(d.zh), f"{d.key}: the Chinese wording is missing"
        assert d.en.strip() and not CJK.search(d.en), f"{d.key}: English wording"


def test_the_interview_answer_is_the_projects_own_data():
    """The drills ask the interview answer's own questions, from answer.py; nothing is read from
    outside the repository."""
    by_key = {d.key: d for d in DRILLS}
    assert (by_key["question"].zh, by_key["question"].en) == interview.QUESTION
    assert "vLLM PagedAttention 原理" in interview.QUESTION[0]
    for i, pair in enumerate(interview.FOLLOW_UPS, 1):
        assert (by_key[f"follow-up-{i}"].zh, by_key[f"follow-up-{i}"].en) == pair
    pitfalls = [d for d in DRILLS if d.source.startswith("pitfall")]
    assert [(d.zh, d.en) for d in pitfalls] == list(interview.PITFALLS)
    for claim_id, (zh, en) in interview.CLAIMS.items():
        assert CJK.search(zh) and en and not CJK.search(en), claim_id


def test_drills_show_the_fact_checks_verdict():
    """One verdict per claim: a drill covering a claim prints the fact-check's finding."""
    from minipaged.kit.quiz import factcheck

    for d in DRILLS:
        for claim, verdict, why in d.answer(SMALL).verdicts:
            f = next(f for f in map(SMALL.finding, factcheck.CHECKS) if f.quote == claim)
            assert (verdict, why) == (f.verdict, f.right), d.key


@pytest.mark.parametrize("drill", DRILLS, ids=[d.key for d in DRILLS])
def test_every_answer_measures_and_says_how(drill):
    a = drill.answer(SMALL)
    assert a.text.strip()
    assert a.commands, f"{drill.key}: no command to reproduce the answer"
    for cmd in a.commands:
        assert cmd.startswith(("minipaged ", "python ", "less ")), cmd
    if drill.key != "pitfall-vllm-only":
        assert a.figures, f"{drill.key}: no measured figure"
    for _claim, verdict, why in a.verdicts:
        assert verdict in ("holds", "off", "unsupported") and why
    text = _text(answer_renderable(a))
    assert "Traceback" not in text


def test_seed_errors_are_called_out():
    by_key = {d.key: d for d in DRILLS}
    for key in ("question", "follow-up-1", "follow-up-2", "refcount-cap", "no-replacement"):
        verdicts = [v for _c, v, _w in by_key[key].answer(SMALL).verdicts]
        assert "off" in verdicts, key


def test_figures_come_from_the_package(monkeypatch):
    """Patch the calculator and the manager: the printed figures must follow."""
    from minipaged.sim import memory

    def fake_table_bytes(context_len, block_size, *, entry_bytes=4):
        return 12345 * entry_bytes

    monkeypatch.setattr(memory, "block_table_bytes", fake_table_bytes)
    figs = dict(drills_answer.follow_up_1(SMALL).figures)
    assert figs["block table, 128K tokens, BS 16, int32"] == quiz.nbytes(12345 * 4)

    import minipaged

    real = minipaged.KVCacheManager.ref_count
    monkeypatch.setattr(minipaged.KVCacheManager, "ref_count",
                        lambda self, b: real(self, b) + 1000)
    figs = dict(drills_answer.refcount_cap(Context(num_requests=30)).figures)
    assert figs["reference count of a block after 100 forks"] == "1101"


def test_simulations_are_shared_between_drills(monkeypatch):
    ctx = Context(num_requests=20)
    calls = []
    import minipaged.sim.simulator as simulator

    real = simulator.simulate
    monkeypatch.setattr(simulator, "simulate", lambda cfg, **kw: calls.append(cfg) or real(cfg))
    ctx.sim(policy="paged")
    ctx.sim(policy="paged")
    assert len(calls) == 1
    assert ctx.sim_command(policy="paged", block_size=32).startswith(
        "minipaged simulate --workload sharegpt --policy paged --num-requests 20 --seed 0")


def test_interactive_reveal_and_quit(monkeypatch):
    keys = iter([" ", "q"])     # reveal the first answer, then quit at "next"
    prompts = []

    def fake_key(prompt):
        prompts.append(prompt)
        return next(keys)

    monkeypatch.setattr(quiz, "wait_key", fake_key)
    console = Console(record=True, width=120, color_system=None)
    chosen = select(list(DRILLS), ["refcount-cap", "gqa", "x-packing"])
    assert run_quiz(chosen, SMALL, answers=False, interactive=True, console=console) == 0
    out = console.export_text()
    assert "reference count of a block after 100 forks" in out      # first answer revealed
    assert "Llama-3-8B KV per token" not in out                      # quit before the second
    assert len(prompts) == 2


def test_select_by_number_and_key_and_reject_unknown():
    assert select(list(DRILLS), ["1", "gqa"])[0].key == "question"
    with pytest.raises(ValueError, match="names no drill"):
        select(list(DRILLS), ["nope"])
    with pytest.raises(ValueError, match="num_requests"):
        Context(num_requests=0)
    with pytest.raises(ValueError, match=r"seed=-1 is out of range: expected >= 0"):
        Context(seed=-1)
    with pytest.raises(TypeError, match="num_requests=True must be an integer, not a bool"):
        Context(num_requests=True)


def test_key_presses_are_decoded_whole():
    # An arrow key is one read of three bytes; it must count as one key, not ESC, "[", "C".
    assert quiz.decode_key("\x1b[C") == "right" and quiz.decode_key("\x1bOC") == "right"
    assert quiz.decode_key("\x1b[D") == "left"
    assert quiz.decode_key("\x1b[A") == "other"
    assert quiz.decode_key("\xe0M") == "right" and quiz.decode_key("\x00K") == "left"  # Windows
    assert quiz.decode_key("Q") == "q" and quiz.decode_key(" ") == " "
    assert quiz.decode_key("") == "q"                  # end of input quits, never spins


def test_wait_key_reads_a_line_where_stdin_is_no_terminal(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Next\n"))
    assert quiz.wait_key("press a key ") == "n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))   # end of input quits
    assert quiz.wait_key("press a key ") == "q"
    assert capsys.readouterr().out == "press a key \n" * 2


def test_wait_key_reads_a_line_from_a_pipe():
    """A real file descriptor that is no terminal (a pipe): termios would refuse it with its own
    error, which the line fallback did not catch."""
    code = "from minipaged.kit.keys import wait_key; print(repr(wait_key('key? ')))"
    out = subprocess.run([sys.executable, "-c", code], input="b\n", capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == "key? \n'b'\n"


def test_cli_answers_worksheet_and_errors():
    out = _cli("--answers", "--num-requests", "25")
    assert out.returncode == 0, out.stderr[-2000:]
    for d in DRILLS:
        assert d.en.split()[0] in out.stdout
    assert out.stdout.count("reproduce:") == len(DRILLS)
    assert "[OFF]" in out.stdout
    sheet = _cli()                                  # not a terminal: questions, no waiting
    assert sheet.returncode == 0
    assert "measured now" not in sheet.stdout and "--answers" in sheet.stdout
    bad = _cli("--only", "nope")
    assert bad.returncode == 2 and "minipaged quiz: --only='nope' names no drill" in bad.stderr
    bad = _cli("--seed", "-1")
    assert bad.returncode == 2 and "--seed=-1 must be >= 0" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_glossary_names_every_key_term_in_both_languages():
    required = ["block table", "block size", "logical block", "physical block", "slot",
                "slot mapping", "token position", "reference count", "fork", "copy-on-write",
                "prefix caching", "preemption", "swap", "recompute", "internal fragmentation",
                "external fragmentation", "reserved", "KV cache", "PagedAttention"]
    for word in required:
        term = glossary.lookup(word)
        assert CJK.search(term.zh), word
        assert glossary.lookup(term.zh) == term
    assert glossary.lookup("块表").en == "block table"
    with pytest.raises(KeyError):
        glossary.lookup("not a term")
    assert len({t.en for t in glossary.GLOSSARY}) == len(glossary.GLOSSARY)
    table = _text(glossary.glossary_table())
    assert "块表" in table and "block table" in table
