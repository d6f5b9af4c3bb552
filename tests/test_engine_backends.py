"""The paged engine on the CUDA kernels: the same tokens as the reference generator.

Proofs:
    * backend="cuda-cpu" (the kernels on the CPU emulation harness): the shipped checkpoint
      (head size 16) and a random model of head size 64 give the reference's greedy tokens, with
      preemption by recompute and by swap;
    * backend="cupy": on a GPU, the reference's tokens and beams (copy-on-write and swaps
      included); without one, a clear error before anything is allocated; and what the backend
      does around the kernels (torch tensors, metadata on the device, swaps, copy-on-write),
      checked on the CPU;
    * the pool is back to full after every call.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from engine_helpers import LOGIT_ATOL, MAX_TOKENS, check_pool_full

pytestmark = pytest.mark.requires("torch")

# backend="cupy": the GPU's matrix products (other blocking, fused multiply-adds) and the
# kernel's softmax round differently from the CPU reference, layer after layer
GPU_LOGIT_ATOL = 1e-3


@pytest.mark.requires("cuda-cpu")
def test_shipped_model_through_the_cuda_kernels_on_the_cpu(model, reference):
    """The shipped checkpoint (head size 16) with backend="cuda-cpu": its greedy tokens equal
    the reference generator's. Two short prompts, block size 8, a pool of 7 blocks: too small
    for both, so one is preempted and recomputed (the kernels also serve the re-prefill).
    Logits within LOGIT_ATOL (the kernel sums in another order than NumPy and uses expf;
    measured about 5e-6)."""
    from minipaged.model.engine import LLM
    from minipaged.model.sampling import SamplingParams

    prompts = ["count down from 13:", "count down from 9:"]
    llm = LLM(model, num_blocks=7, block_size=8, backend="cuda-cpu")
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS), return_logits=True)
    for prompt, out in zip(prompts, outs):
        ref = reference[prompt]
        assert out.outputs[0].token_ids == ref.token_ids, prompt
        np.testing.assert_allclose(out.outputs[0].logits, ref.logits, atol=LOGIT_ATOL, rtol=0)
    assert llm.num_preemptions > 0
    check_pool_full(llm)


def test_cuda_kernels_under_cpu_emulation_as_the_backend():
    """backend="cuda-cpu" with head size 64 (a small random model, the kernels' other
    instantiations) and swap preemption: the CUDA kernels (run by the CPU emulation harness)
    write, copy and read the pages. Tokens equal the reference's; logits within 1e-3 (the
    kernel sums in another order and uses expf; the weights are scaled up so that logits are
    far apart and greedy is stable)."""
    from capabilities import require

    require("cuda-cpu")
    import torch

    from minipaged.model.decoder import Decoder, ModelConfig
    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams

    torch.manual_seed(0)
    m = Decoder(ModelConfig(dim=128, n_heads=2, n_kv_heads=1, n_layers=1, hidden_dim=64,
                            max_seq_len=64)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(10)
    prompts = ["count down from 5:", "hello", "x"]
    sp = SamplingParams(max_tokens=10)
    ref = ReferenceGenerator(m).generate(prompts, sp, return_logits=True)
    llm = LLM(m, num_blocks=6, block_size=8, backend="cuda-cpu", preemption="swap")
    outs = llm.generate(prompts, sp, return_logits=True)
    for a, b in zip(outs, ref):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        np.testing.assert_allclose(a.outputs[0].logits, b.outputs[0].logits, atol=1e-3, rtol=0)
    assert llm.num_preemptions > 0
    check_pool_full(llm)
    with pytest.raises(ValueError, match="compiled for head sizes"):
        LLM(m, block_size=4, backend="cuda-cpu")


def test_cupy_backend_without_a_gpu_is_a_clear_error(model, capsys):
    """backend="cupy" needs a CUDA GPU (and CuPy); without one, LLM and `minipaged generate`
    say so and point to the CPU backends, before any memory is allocated."""
    import torch

    from minipaged.kit.cli import main
    from minipaged.model.engine import LLM
    from minipaged.model.runner import BackendUnavailableError

    if torch.cuda.is_available() and importlib.util.find_spec("cupy") is not None:
        pytest.skip("this machine can run backend='cupy' (tested by the gpu-marked test)")
    expected = r"backend='cupy' .*(no CUDA device|CuPy).*use backend='numpy' \(the default\)"
    with pytest.raises(BackendUnavailableError, match=expected):
        LLM(model, num_blocks=8, block_size=8, backend="cupy")
    assert main(["generate", "count down from 3:", "--backend", "cupy"]) == 2
    captured = capsys.readouterr()
    # the command line says its flag: --backend=cupy ... use --backend=numpy (the default)
    assert "--backend=cupy runs" in captured.err and captured.out == ""
    assert "use --backend=numpy (the default) or --backend=cuda-cpu" in captured.err
    with pytest.raises(ValueError, match=r"backend='gpu' is not one of \['numpy', 'cuda-cpu', "
                                         r"'cupy'\]"):
        LLM(model, backend="gpu")


@pytest.mark.requires("cuda-cpu")
def test_cupy_backend_plumbing_with_torch_tensors_on_the_cpu(model, monkeypatch):
    """What backend="cupy" does around the kernels (pages as torch tensors, metadata moved to
    the device, swaps between the pages and the host pool, copy-on-write) checked without a
    GPU: the device is the CPU, and each launcher is replaced by one that insists on torch
    tensors (a NumPy array would mean the runner left something on the host) and runs the
    CPU harness on their NumPy views. Beam search with a small swap pool: every path runs."""
    import torch

    from minipaged.cuda import launch
    from minipaged.model import runner
    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams

    def torch_only(fn):
        def launcher(*arrays, backend, **kw):
            assert backend == "cupy"
            # every array a tensor (copy_blocks' (src, dst) pairs come as a plain list)
            assert all(isinstance(a, (torch.Tensor, list)) for a in arrays), \
                [type(a).__name__ for a in arrays]
            out = fn(*(a.numpy() if isinstance(a, torch.Tensor) else a for a in arrays),
                     backend="cpu", **kw)
            return None if out is None else torch.from_numpy(out)
        return launcher

    for name in ("paged_attention", "reshape_and_cache", "copy_blocks"):
        monkeypatch.setattr(launch, name, torch_only(getattr(launch, name)))
    monkeypatch.setattr(runner, "_cuda_device", lambda: torch.device("cpu"))
    prompts = ["count down from 12:", "count down from 31:", "Hi"]
    p = SamplingParams(max_tokens=20, beam_width=3)
    ref = ReferenceGenerator(model).generate(prompts, p)
    llm = LLM(model, num_blocks=24, block_size=8, preemption="swap", backend="cupy")
    assert isinstance(llm.runner.key_caches[0], torch.Tensor)
    outs = llm.generate(prompts, p)
    for a, b in zip(outs, ref):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert llm.num_preemptions > 0
    assert llm.runner.num_blocks_copied > 0 and llm.runner.num_blocks_swapped > 0
    check_pool_full(llm)


@pytest.mark.requires("gpu")
def test_cupy_backend_on_a_gpu_matches_the_reference(model, reference):
    """backend="cupy": the model on the GPU, the pages torch CUDA tensors, the CUDA kernels
    launched through CuPy on them (DLPack, no copy). Greedy tokens equal the reference
    generator's (on the CPU); logits within GPU_LOGIT_ATOL (the GPU's matrix products and the
    kernel's softmax round differently from the CPU's). Beam search, with a pool small enough
    to force a swap, also exercises copy_blocks (copy-on-write) and the GPU <-> host swaps."""
    import torch
    from capabilities import require

    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams

    if not torch.cuda.is_available():
        require("gpu", why=f"CuPy sees a GPU but torch {torch.__version__} has no CUDA")
    prompts = ["count down from 13:", "count down from 52:", "Hello, paged world!"]
    llm = LLM(model, num_blocks=16, block_size=16, backend="cupy")
    assert llm.runner.key_caches[0].is_cuda and next(model.parameters()).device.type == "cpu"
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS), return_logits=True)
    for prompt, out in zip(prompts, outs):
        ref = reference[prompt]
        assert out.outputs[0].token_ids == ref.token_ids, prompt
        np.testing.assert_allclose(out.outputs[0].logits, ref.logits, atol=GPU_LOGIT_ATOL,
                                   rtol=0)
    check_pool_full(llm)

    beams = ["count down from 12:", "count down from 31:", "Hi"]
    p = SamplingParams(max_tokens=20, beam_width=3)
    ref_beams = ReferenceGenerator(model).generate(beams, p)
    llm = LLM(model, num_blocks=24, block_size=8, preemption="swap", backend="cupy")
    outs = llm.generate(beams, p)
    for a, b in zip(outs, ref_beams):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert llm.runner.num_blocks_copied > 0 and llm.runner.num_blocks_swapped > 0
    check_pool_full(llm)
