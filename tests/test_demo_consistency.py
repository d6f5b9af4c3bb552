"""The demo never lies: at every frame of every scene, what is drawn equals the managers' state.

Each scene is paused at every frame (its generator is stepped one frame at a time), and every
view the frame drew is compared with an independent re-reading of the live managers:

* a paged pool: each physical block's owners are exactly the sequences whose block table holds
  it, its reference count is the manager's, free blocks are the manager's free count, and the
  slots drawn per category add up to the manager's own ``usage()``;
* a contiguous arena: the slots drawn per category equal ``usage(need)`` and its slow oracle
  ``usage_slow(need)``, and each drawn reservation is the cache's own.
Seeds vary so that more than one layout is checked.
"""

from __future__ import annotations

import pytest

from minipaged.contiguous.usage import CATEGORIES
from minipaged.kit.viz.scenes import SCENES
from minipaged.kit.viz.state import ArenaView, PoolView, count_categories

READY = [cls for cls in SCENES if cls.missing() is None]


def check_pool(view: PoolView, m, final_lens) -> None:
    swapped = set(getattr(m, "swapped_seq_ids", ()))
    live = [s for s in m.seq_ids if s not in swapped]
    assert [t.seq_id for t in view.tables] == live
    assert view.num_free == m.num_free_blocks
    for t in view.tables:
        assert list(t.blocks) == m.block_table(t.seq_id)
        assert t.seq_len == m.seq_len(t.seq_id)
    for b in view.blocks:
        owners = [s for s in live if b.block in m.block_table(s)]
        assert list(b.owners) == owners, f"block {b.block}"
        assert b.ref_count == m.ref_count(b.block), f"block {b.block}"
        if b.state in ("free", "cached"):
            assert m.ref_count(b.block) == 0
    n_free = sum(1 for b in view.blocks if b.state in ("free", "cached"))
    assert n_free == m.num_free_blocks
    if not any(b.state == "held" for b in view.blocks):
        usage = m.usage(final_lens).as_dict()
        assert count_categories(view.slot_categories(final_lens)) == {
            c: usage[c] for c in CATEGORIES}
    for t in view.swapped:
        assert list(t.blocks) == m.cpu_block_table(t.seq_id)


def check_arena(view: ArenaView, cache) -> None:
    usage = cache.usage(view.need)
    assert view.usage == usage == cache.usage_slow(view.need)
    assert count_categories(view.slot_categories()) == {c: getattr(usage, c) for c in CATEGORIES}
    assert [r.seq_id for r in view.reservations] == cache.seq_ids
    for r in view.reservations:
        mine = cache.reservation(r.seq_id)
        assert (r.offset, r.held, r.num_tokens, r.final_len) == (
            mine.offset, mine.held, mine.num_tokens, mine.final_len)


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("cls", READY, ids=[c.name for c in READY])
def test_every_frame_shows_the_managers_state(cls, seed):
    scene = cls(seed=seed, width=100)
    n = 0
    for frame in scene.frames():
        managers = scene.managers()
        final = frame.views.get("final_lens", {})
        checked = 0
        for name, view in frame.views.items():
            if isinstance(view, PoolView):
                check_pool(view, managers[name], final.get(name))
                checked += 1
            elif isinstance(view, ArenaView):
                check_arena(view, managers[name])
                checked += 1
        assert checked, f"frame {n} of {cls.name} carries no view to check"
        n += 1
    assert n >= 3


# ---- the model scene: the real engine, paused inside its on_step callback --------------------

def _model_frames(seed: int):
    """Yield (scene, frame, frame text) for the model scene, the engine paused at each frame."""
    import io

    from rich.console import Console

    from minipaged.kit.viz.scenes.model import ModelScene

    scene = ModelScene(seed=seed, width=100)
    for frame in scene.frames():
        console = Console(width=100, record=True, color_system=None, file=io.StringIO())
        console.print(frame.renderable())
        yield scene, frame, console.export_text()


@pytest.mark.requires("torch")
@pytest.mark.parametrize("seed", [0, 5])
def test_model_scene_shows_the_engine_tokens_sharing_and_copies(seed):
    from minipaged.kit.viz.scenes import model as scene_mod
    from minipaged.model import LLM, SamplingParams

    texts = scene_mod.token_texts()
    bs = scene_mod.BLOCK_SIZE
    saw_shared = saw_copy = False
    frames = []
    for scene, frame, drawn in _model_frames(seed):
        m = scene.managers()["pool"]
        view = frame.views["pool"]
        frames.append(frame)
        for t in view.tables:
            # The tokens drawn are the engine's own token ids, through the model's tokenizer,
            # with a bar at every block boundary.
            ids = m.token_ids(t.seq_id)
            assert list(t.token_ids) == list(ids)
            chunks = ["".join(texts[i] for i in ids[k:k + bs]) for k in range(0, len(ids), bs)]
            assert f"{scene.labels(t.seq_id)}: " + "|".join(chunks) in drawn
        owners = {b.block: b.owners for b in view.blocks}
        if len(view.tables) == 2 and any(b.ref_count == 2 for b in view.blocks):
            saw_shared = True
        for src, dst in view.copies:
            # copy-on-write: the destination belongs to one sample alone, and the source is
            # still held by (exactly) the other one
            saw_copy = True
            assert len(owners[dst]) == 1 and len(owners[src]) == 1
            assert owners[src] != owners[dst]
            assert f"⧉{src}" in drawn
    assert saw_shared and saw_copy
    last = frames[-1]
    assert last.views["pool"].num_free == scene_mod.NUM_BLOCKS  # the pool is full again
    # The completions shown are what the engine returns for the same request when nobody
    # watches (no callback, no pauses).
    llm = LLM(num_blocks=scene_mod.NUM_BLOCKS, block_size=bs)
    prompt = f"count down from {scene_mod.start_for(seed)}:"
    out = llm.generate([prompt], SamplingParams(
        max_tokens=scene_mod.MAX_TOKENS, temperature=scene_mod.TEMPERATURE,
        n=scene_mod.N_SAMPLES, seed=seed))[0]
    checks = [e.text for e in last.events if e.kind == "check"]
    assert len(checks) == len(out.outputs) == scene_mod.N_SAMPLES
    for o, line in zip(out.outputs, checks):
        assert f"sample {o.index}: \"{prompt}\" -> {o.text!r}" in line


@pytest.mark.requires("torch")
def test_model_scene_closed_early_unwinds_the_engine():
    import threading

    from minipaged.kit.viz.scenes.model import ModelScene

    scene = ModelScene(seed=1, width=100)
    frames = scene.frames()
    next(frames)
    next(frames)
    assert any(t.name == "minipaged-model-scene" for t in threading.enumerate())
    frames.close()  # what quitting the demo does
    assert not any(t.name == "minipaged-model-scene" for t in threading.enumerate())


def test_model_scene_without_torch_is_skipped_with_the_reason(monkeypatch):
    import importlib.util

    from minipaged.kit.demo import tour
    from minipaged.kit.viz.scenes.model import ModelScene

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "torch" else real(name, *a, **k))
    why = ModelScene.missing()
    assert why is not None and "torch" in why
    playing, skipped = tour(0, 100)
    assert ("model", why) in skipped
    assert "model" not in [s.name for s in playing]
    assert {"fragmentation", "paging"} <= {s.name for s in playing}
