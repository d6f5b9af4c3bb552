"""Workloads for the simulator: who asks for how many tokens, and when.

What this teaches: the vLLM paper (section 6.1, Fig. 11) drives its serving experiments with two
request traces whose *lengths* decide everything about memory: ShareGPT (long prompts, long
answers: mean input about 161 tokens, mean output about 338) and Alpaca (short instructions and
short answers: about 19 and 58). Requests arrive as a Poisson process at a chosen rate. Read next:
``memory.py`` (how many token slots a GPU has), then ``cost.py`` (how long a step takes).

Distribution choice (documented because the real traces are not shipped):
    Both lengths are drawn from a **log-normal** distribution. Real chat traces are right-skewed
    with a long tail (a few very long conversations, many short ones); a log-normal is the usual
    two-parameter fit for such data and needs only a mean and a spread. The spread ``sigma`` is
    our choice (stated per workload below); the location ``mu`` is solved so that the mean *after*
    capping equals the paper's mean, so capping at the model's maximum length does not bias it.
    Lengths are rounded to integers >= 1, and each request is capped so that
    ``prompt_len + output_len <= max_model_len`` (2048 for OPT, as in the paper).

Everything is seeded: the same seed gives the same requests, bit for bit.

Bring your own trace: a JSONL file with one request per line,
``{"prompt_len": 12, "output_len": 40}`` and optionally ``"arrival_s": 0.5``. A malformed line is
reported with the file, the line number and the field, and nothing is returned for half a file.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minipaged._checks import check_float, check_int


@dataclass(frozen=True)
class Request:
    """One request of a trace. ``output_len`` is how many tokens it will generate (the simulator
    has no end-of-sequence token, so the trace decides when a request stops)."""

    request_id: int
    arrival_s: float
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class LengthDist:
    """A log-normal length distribution with a target mean (after capping) and a spread."""

    mean: float
    sigma: float


# name -> (input distribution, output distribution). Means are the paper's Fig. 11 figures; the
# sigmas are our choice: ShareGPT's inputs spread wider than its outputs (pasted documents vs
# answers); Alpaca's instructions are short and uniform.
WORKLOADS: dict[str, tuple[LengthDist, LengthDist]] = {
    "sharegpt": (LengthDist(161.31, 1.0), LengthDist(337.99, 0.8)),
    "alpaca": (LengthDist(19.31, 0.6), LengthDist(58.45, 0.8)),
}


def _capped_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X ~ LogNormal(mu, sigma), in closed form."""
    def phi(z: float) -> float:
        return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    lc = math.log(cap)
    return (math.exp(mu + sigma * sigma / 2) * phi((lc - mu - sigma * sigma) / sigma)
            + cap * (1.0 - phi((lc - mu) / sigma)))


def solve_mu(mean: float, sigma: float, cap: float) -> float:
    """The log-normal location whose mean after capping at ``cap`` is ``mean`` (bisection)."""
    if not 0 < mean < cap:
        raise ValueError(f"mean={mean} must lie in (0, cap={cap})")
    lo, hi = math.log(mean) - 10.0, math.log(cap) + 10.0
    for _ in range(200):  # the capped mean is increasing in mu: plain bisection converges
        mid = (lo + hi) / 2
        if _capped_lognormal_mean(mid, sigma, cap) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def check_request_rate(request_rate: object) -> float:
    """Requests per second as a float: > 0 (inf: all at t=0), and not so small that the mean gap
    1/rate overflows (1e-320 drew infinite arrival times)."""
    rate = math.inf if request_rate == math.inf else check_float("request_rate", request_rate)
    if not rate > 0 or not math.isfinite(1.0 / rate):
        raise ValueError(f"request_rate={rate} must be > 0 with a finite mean gap 1/rate (use inf "
                         "for all at once)")
    return rate


def check_workload_args(*, request_rate: object, seed: object, max_model_len: object,
                        num_requests: object = 1) -> float:
    """The arguments every workload takes, checked by name; returns the request rate's float."""
    check_int("num_requests", num_requests, low=1)
    check_int("seed", seed, low=0)
    check_int("max_model_len", max_model_len, low=2)
    return check_request_rate(request_rate)


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (seconds) of ``n`` requests of a Poisson process with ``rate`` requests/s
    (``check_workload_args`` checked it): the gaps are independent exponentials with mean
    1/rate. ``rate=inf`` puts all at t=0."""
    if math.isinf(rate):
        return np.zeros(n)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def synthetic(name: str, num_requests: int, *, request_rate: float = math.inf, seed: int = 0,
              max_model_len: int = 2048) -> list[Request]:
    """``num_requests`` requests shaped like the paper's ``sharegpt`` or ``alpaca`` trace."""
    if name not in WORKLOADS:
        raise ValueError(f"workload={name!r} is not one of {sorted(WORKLOADS)} (or a .jsonl file)")
    request_rate = check_workload_args(request_rate=request_rate, seed=seed,
                                       max_model_len=max_model_len, num_requests=num_requests)
    rng = np.random.default_rng(seed)
    dist_in, dist_out = WORKLOADS[name]
    cap = float(max_model_len - 1)
    lens = []
    for d in (dist_in, dist_out):
        mu = solve_mu(min(d.mean, cap / 2), d.sigma, cap)
        x = np.minimum(rng.lognormal(mu, d.sigma, size=num_requests), cap)
        lens.append(np.maximum(np.rint(x), 1).astype(np.int64))
    prompt, output = lens
    output = np.minimum(output, max_model_len - prompt)  # the whole request fits the model
    arrivals = poisson_arrivals(num_requests, request_rate, rng)
    return [Request(i, float(arrivals[i]), int(prompt[i]), int(output[i]))
            for i in range(num_requests)]


def check_workload(spec: object) -> None:
    """A workload is one of ``WORKLOADS`` or the path of a trace file (``load_jsonl``): a
    directory or an empty name (which ``Path`` reads as ".") is refused by name."""
    if isinstance(spec, str) and spec in WORKLOADS:
        return
    if not isinstance(spec, (str, os.PathLike)):
        raise TypeError(f"workload={spec!r:.60} must be a workload name or a path, got "
                        f"{type(spec).__name__}")
    p = Path(spec)
    why = ("is empty" if str(spec) == "" else None if p.is_file()
           else "is a directory" if p.is_dir() else "does not exist")
    if why:
        raise ValueError(f"workload={str(spec)!r} {why}; expected one of {sorted(WORKLOADS)} or "
                         "the path of a JSONL trace file")


def has_arrival_times(path: str | Path) -> bool:
    """True when a trace ``load_jsonl`` accepts gives ``arrival_s`` (then on every line, so the
    first says it), and ``request_rate`` is not used."""
    with Path(path).open(encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), None)
    try:
        obj = None if first is None else json.loads(first)
    except ValueError:  # not JSON: load_jsonl names the line
        return False
    return isinstance(obj, dict) and obj.get("arrival_s") is not None


def load_jsonl(path: str | Path, *, request_rate: float = math.inf, seed: int = 0,
               max_model_len: int = 2048) -> list[Request]:
    """Requests from a JSONL trace. Lines need ``prompt_len`` and ``output_len`` (ints >= 1);
    ``arrival_s`` is optional but then required on every line (otherwise Poisson arrivals at
    ``request_rate`` are drawn with ``seed``). Outputs are capped so a request fits
    ``max_model_len``; a prompt that alone fills the model is an error. Blank lines are skipped."""
    request_rate = check_workload_args(request_rate=request_rate, seed=seed,
                                       max_model_len=max_model_len)
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"workload file {str(path)!r} "
                         f"{'is a directory' if path.is_dir() else 'does not exist'}")
    rows: list[tuple[int, int, float | None]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            vals = []
            for field in ("prompt_len", "output_len"):
                v = obj.get(field)
                if v is None:
                    raise ValueError(f"{where}: missing field {field!r}")
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(f"{where}: field {field!r} = {v!r} must be an int >= 1")
                vals.append(v)
            if vals[0] >= max_model_len:
                raise ValueError(f"{where}: field 'prompt_len' = {vals[0]} leaves no room to "
                                 f"generate within max_model_len={max_model_len}")
            arr = obj.get("arrival_s")
            if arr is not None and (isinstance(arr, bool) or not isinstance(arr, (int, float))
                                    or not math.isfinite(arr) or arr < 0):
                raise ValueError(f"{where}: field 'arrival_s' = {arr!r} must be a number >= 0")
            if rows and (arr is None) != (rows[0][2] is None):
                raise ValueError(f"{where}: field 'arrival_s' must be given on every line or "
                                 f"on none (line {rows[0][2] is None and 'without' or 'with'} "
                                 f"it came first)")
            rows.append((vals[0], min(vals[1], max_model_len - vals[0]),
                         None if arr is None else float(arr)))
    if not rows:
        raise ValueError(f"workload file {str(path)!r} holds no requests")
    if rows[0][2] is None:
        arrivals = poisson_arrivals(len(rows), request_rate, np.random.default_rng(seed))
    else:
        arrivals = np.array([r[2] for r in rows])
    order = np.argsort(arrivals, kind="stable")  # the trace may list requests out of order
    return [Request(i, float(arrivals[j]), rows[j][0], rows[j][1])
            for i, j in enumerate(order)]


def make_workload(spec: str, num_requests: int, *, request_rate: float = math.inf,
                  seed: int = 0, max_model_len: int = 2048) -> list[Request]:
    """``sharegpt`` / ``alpaca`` (synthetic), or the path of a JSONL trace (its first
    ``num_requests`` requests; all of them when the file holds fewer)."""
    check_workload(spec)
    if spec in WORKLOADS:
        return synthetic(spec, num_requests, request_rate=request_rate, seed=seed,
                         max_model_len=max_model_len)
    check_int("num_requests", num_requests, low=1)
    reqs = load_jsonl(spec, request_rate=request_rate, seed=seed, max_model_len=max_model_len)
    return reqs[:num_requests]


def prompt_token_ids(request_id: int, prompt_len: int) -> list[int]:
    """Synthetic prompt tokens. The first token is unique per request, so with prefix caching two
    different requests never share a block by accident (block hashes are chained from the first
    block); requests that *should* share (parallel samples in v1 style) reuse one request id."""
    return [request_id + 1] + [(request_id * 31 + i * 7) % 32000 + 1 for i in range(1, prompt_len)]
