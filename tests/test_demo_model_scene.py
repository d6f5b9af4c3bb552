"""The model scene: the real engine, paused inside its on_step callback, drawn truthfully.

At every frame the tokens drawn are the engine's own token ids through the model's tokenizer,
with a bar at every block boundary; the scene shows two samples sharing a block and a
copy-on-write copy; the completions it shows are what the engine returns for the same request
when nobody watches. Closing the scene early unwinds the engine's thread, and without torch the
tour skips the scene with the reason. (Its captions are checked with every other scene's in
tests/test_demo_consistency.py.)
"""

from __future__ import annotations

import pytest


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
