"""Scheduling in lockstep: minipaged's Scheduler against vLLM v1's, with a stand-in model.

vLLM's v1 ``Scheduler`` (vllm/v1/core/sched/scheduler.py) runs standalone on a CPU: it needs a
``VllmConfig`` (built here from a tiny local transformers ``LlamaConfig``, tokenizer skipped,
so nothing is downloaded), a ``KVCacheConfig`` with one full-attention group, and, after each
``schedule()``, a ``ModelRunnerOutput`` saying which token each request sampled: that stand-in
model samples one token for every request whose prompt is complete after the step and nothing
for a partial prefill chunk, exactly what a real model runner returns. minipaged's
``Scheduler`` over a ``PagedPolicy`` gets the same requests at the same steps and the same
sampled tokens. Compared after every step: the tokens scheduled per request (which requests
were admitted, each prefill chunk's size, the decodes), the requests preempted, the running
queue and the waiting queue in order.

Settings matched on both sides, each with the vLLM source that sets it:
  * chunked prefill with one token budget per step (``max_num_batched_tokens``) and a cap on
    running requests (``max_num_seqs``), FCFS, preemption by recompute (v1's only mode);
  * no watermark: vLLM's default ``watermark=0.0`` (vllm/config/scheduler.py:196), so
    minipaged's PagedPolicy gets ``watermark=0.0`` (its default is 1%);
  * no long-prefill cap: ``long_prefill_token_threshold=0`` (vllm/config/scheduler.py:79);
  * synchronous scheduling (``async_scheduling=False``; the engine picks AsyncScheduler
    otherwise, vllm/config/scheduler.py:208-230);
  * the null block: vLLM gets ``num_blocks + 1`` (v1/core/block_pool.py:184-188).

A documented difference, normalised when asked (``reference="normalised"``): vLLM checks at
admission that the whole prompt fits (``scheduler_reserve_full_isl=True``,
vllm/config/scheduler.py:190, used at v1/core/sched/scheduler.py:1270) but then allocates KV
blocks one prefill chunk at a time; minipaged's ``PagedPolicy.admit`` allocates the whole
prompt at admission. Normalised, vLLM's ``allocate_slots`` is asked for the rest of the prompt
as lookahead slots when it admits a request, which is minipaged's rule.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from functools import cache

import torch
from peer_sides import keep_first_copy_only, minipaged_keeps_duplicates
from peer_traces import SchedTrace
from transformers import LlamaConfig
from vllm.config import CacheConfig, ModelConfig, VllmConfig
from vllm.config import SchedulerConfig as VllmSchedulerConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

import minipaged
from minipaged.serving.memory_policy import PagedPolicy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig, StepResult

MAX_MODEL_LEN = 1024
METRICS = ("scheduled_tokens", "preempted", "running", "waiting")


@dataclass
class SchedReport:
    trace: str
    steps: int = 0
    compared: Counter = field(default_factory=Counter)
    equal: Counter = field(default_factory=Counter)
    divergences: list[str] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.divergences and not self.stats["unfinished"]

    def summary(self) -> str:
        lines = [f"{self.trace}: {self.steps} steps, stats {dict(self.stats)}"]
        lines += [f"  {m}: {self.equal[m]}/{self.compared[m]} equal" for m in self.compared]
        lines += [f"  divergence: {d}" for d in self.divergences[:4]]
        return "\n".join(lines)


@cache
def _model_config() -> ModelConfig:
    """A tiny decoder's config, written locally: the scheduler reads lengths and flags only."""
    path = tempfile.mkdtemp(prefix="minipaged-vllm-model-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=2,
                max_position_embeddings=MAX_MODEL_LEN).save_pretrained(path)
    return ModelConfig(model=path, skip_tokenizer_init=True, dtype="float32",
                       max_model_len=MAX_MODEL_LEN)


def vllm_scheduler(t: SchedTrace, whole_prompt_at_admission: bool) -> VllmScheduler:
    cache_config = CacheConfig(block_size=t.block_size, enable_prefix_caching=t.prefix_caching)
    cache_config.num_gpu_blocks = t.num_blocks + 1  # + the null block
    sched_config = VllmSchedulerConfig(
        max_num_seqs=t.max_num_seqs, max_num_batched_tokens=t.max_num_batched_tokens,
        max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True, is_encoder_decoder=False,
        async_scheduling=False)
    config = VllmConfig(model_config=_model_config(), cache_config=cache_config,
                        scheduler_config=sched_config)
    spec = FullAttentionSpec(block_size=t.block_size, num_kv_heads=2, head_size=32,
                             dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=t.num_blocks + 1, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"],
                                                         spec)])
    sched = VllmScheduler(vllm_config=config, kv_cache_config=kv, block_size=t.block_size,
                          structured_output_manager=StructuredOutputManager(config))
    if whole_prompt_at_admission:
        _allocate_whole_prompt_at_admission(sched.kv_cache_manager)
    if t.prefix_caching and not minipaged_keeps_duplicates():
        keep_first_copy_only(sched.kv_cache_manager.block_pool)  # peer_sides, difference 3
    return sched


def _allocate_whole_prompt_at_admission(mgr) -> None:
    """The documented difference, as minipaged's rule: admitting a request (WAITING or
    PREEMPTED) allocates slots for the rest of its prompt too, as lookahead slots."""
    allocate = mgr.allocate_slots

    def allocate_slots(request, num_new_tokens, num_new_computed_tokens=0, *args, **kwargs):
        if request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            rest = (request.num_tokens - request.num_computed_tokens
                    - num_new_computed_tokens - num_new_tokens)
            kwargs["num_lookahead_tokens"] = max(rest, 0)
        return allocate(request, num_new_tokens, num_new_computed_tokens, *args, **kwargs)

    mgr.allocate_slots = allocate_slots


def minipaged_scheduler(t: SchedTrace) -> Scheduler:
    manager = minipaged.KVCacheManager(t.num_blocks, t.block_size,
                                       enable_prefix_caching=t.prefix_caching)
    return Scheduler(PagedPolicy(manager, watermark=0.0),
                     SchedulerConfig(max_num_seqs=t.max_num_seqs,
                                     max_num_batched_tokens=t.max_num_batched_tokens,
                                     max_model_len=MAX_MODEL_LEN, chunked_prefill=True))


def _token(rid: str, n: int) -> int:
    """The stand-in model's sample: the same on both sides (a function of the request, the
    number of tokens so far)."""
    return zlib.crc32(f"{rid}:{n}".encode()) % 1000


def run_sched_trace(t: SchedTrace, reference: str = "normalised") -> SchedReport:
    if reference not in ("normalised", "stock"):
        raise ValueError(f"reference={reference!r}; expected 'normalised' or 'stock'")
    vs = vllm_scheduler(t, whole_prompt_at_admission=reference == "normalised")
    ms = minipaged_scheduler(t)
    report = SchedReport(f"{t.name}[seed={t.seed}] vs {reference} vLLM")
    requests: dict[str, Request] = {}
    hasher = None
    if t.prefix_caching:  # the engine's block hasher, as for the block-manager comparison
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(t.block_size, hash_fn)
    pending = sorted(t.requests)
    for step in range(t.max_steps):
        if not (pending or ms.has_unfinished() or vs.has_requests()):
            break
        while pending and pending[0][0] <= step:
            _, rid, prompt, n_out = pending.pop(0)
            ms.add_request(rid, prompt, n_out, arrival_s=float(step))
            requests[rid] = Request(rid, list(prompt), SamplingParams(max_tokens=n_out,
                                                                      ignore_eos=True),
                                    None, arrival_time=float(step), block_hasher=hasher)
            vs.add_request(requests[rid])
        # minipaged
        mo = ms.schedule()
        mine = Counter({c.seq.group.request_id: c.end - c.start for c in mo.prefills})
        mine.update(s.group.request_id for s in mo.decodes)
        mine_pre = sorted(g.request_id for g, _ in mo.preempted)
        ms.update(mo, StepResult(0.0, [_token(s.group.request_id, len(s.token_ids))
                                       for s in mo.sampled]), float(step))
        # vLLM: schedule() has already counted the scheduled tokens as computed
        vo = vs.schedule()
        theirs = Counter(vo.num_scheduled_tokens)
        theirs_pre = sorted(vo.preempted_req_ids or ())
        ids = list(vo.num_scheduled_tokens)
        sampled = [[_token(r, requests[r].num_tokens)]
                   if requests[r].num_computed_tokens >= requests[r].num_tokens else []
                   for r in ids]
        vs.update_from_output(vo, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled))
        report.stats["preemptions"] += len(theirs_pre)
        report.stats["partial_prefill_chunks"] += sampled.count([])
        for metric, a, b in (
                ("scheduled_tokens", dict(mine), dict(theirs)),
                ("preempted", mine_pre, theirs_pre),
                ("running", [g.request_id for g in ms.running],
                 [r.request_id for r in vs.running]),
                ("waiting", [g.request_id for g in ms.waiting],
                 [r.request_id for r in vs.waiting])):
            report.compared[metric] += 1
            if a == b:
                report.equal[metric] += 1
            else:
                report.divergences.append(f"step {step}: {metric}: minipaged {a} != vLLM {b}")
        report.steps += 1
    report.stats["unfinished"] = len(pending) + ms.has_unfinished() + vs.has_requests()
    return report
