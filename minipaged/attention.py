"""Dense attention: the oracle every paged path in this project is checked against.

What this teaches: scaled dot-product attention exactly as a decoder runs it, with the three
details that matter once K and V live in a cache:

* **causal with an offset.** During decode the T new queries are the *last* T positions of a
  context of Tk tokens, so query t sees keys ``0 .. Tk - T + t`` (prefill is the case T == Tk,
  decode the case T == 1, a chunked prefill or a prefix-cache hit anything in between);
* **grouped-query attention** (GQA; MQA is Hkv == 1): H query heads share Hkv KV heads, query
  head h reads KV head ``h // (H // Hkv)``. The cache stores Hkv heads, which is why Llama-3-8B
  needs 4x less KV memory per token than a multi-head model of the same width (lesson 01);
* **the online softmax** (``tile=n``): the same attention computed over tiles of n keys while
  carrying a running max m and a running sum l, rescaling what was accumulated so far by
  ``exp(m_old - m_new)`` whenever the max grows. This is how FlashAttention and vLLM's paged
  kernel work: they never hold a whole row of scores, only one tile (one block) at a time.

Accumulation dtype: float16 inputs are upcast to float32 once; every product, the softmax and
the weighted sum of V run in float32 and the output is rounded to float16 once at the end (what
GPU kernels do with half inputs). float32 computes in float32, float64 in float64.

Why the arithmetic is organised the way it is: ``paged_attention.py`` promises **bit-for-bit**
equality with this oracle. Floating-point sums depend on their order, and NumPy's order depends
on array shapes (pairwise summation along a row, BLAS blocking inside a matmul). So the oracle
is written as three small kernels over head-major arrays (``_to_heads``, ``plain_softmax``,
``online_softmax``) and the paged paths call the *same* kernels on K/V they fetched through a
block table, with identical per-head shapes. What the paged paths change is only where K and V
come from; that is the whole claim of PagedAttention (vLLM paper, section 4.1).

Read before: nothing (start here). Read next: ``contiguous/usage.py`` (stage 2, lesson 02).
"""

from __future__ import annotations

import numpy as np

from minipaged._checks import SUPPORTED_DTYPES, check_dtype  # noqa: F401 (re-exported)


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """float16 accumulates in float32; float32 and float64 in themselves."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def check_tile(tile: int | None) -> None:
    if tile is None:
        return
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or tile < 1:
        raise ValueError(f"tile={tile!r} must be None (plain softmax) or a positive int "
                         "(online softmax over tiles of that many keys)")


def check_scale(scale: float | None) -> None:
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)) \
            or not np.isfinite(scale):
        raise ValueError(f"scale={scale!r} must be None (1/sqrt(D)) or a finite number")


def row_limits(T: int, Tk: int, G: int, causal: bool) -> np.ndarray:
    """Index of the last key each score row may see, for rows ordered (g, t): [G*T] int64.

    Causal with offset: query t is token position Tk - T + t, so it sees keys 0 .. Tk - T + t.
    Every row sees at least key 0 (T <= Tk), so no softmax row is ever empty."""
    last = np.arange(Tk - T, Tk, dtype=np.int64) if causal else np.full(T, Tk - 1, np.int64)
    return np.tile(last, G)


def _to_heads(q: np.ndarray, num_kv_heads: int, scale: float, acc: np.dtype) -> np.ndarray:
    """q [T, H, D] -> scaled qh [Hkv, G*T, D] in the accumulation dtype, rows ordered (g, t).

    All G query heads that share a KV head become the rows of one matrix, so each KV head's
    K is multiplied once (one GEMM per KV head) instead of G times."""
    T, H, D = q.shape
    G = H // num_kv_heads
    qh = q.astype(acc).reshape(T, num_kv_heads, G, D).transpose(1, 2, 0, 3)  # [Hkv, G, T, D]
    qh = np.ascontiguousarray(qh).reshape(num_kv_heads, G * T, D)
    qh *= np.asarray(scale, dtype=acc)
    return qh


def _from_heads(oh: np.ndarray, T: int) -> np.ndarray:
    """oh [Hkv, G*T, D] -> [T, H, D] with h = kv_head * G + g (the inverse of ``_to_heads``)."""
    hkv, rows, D = oh.shape
    G = rows // T
    return oh.reshape(hkv, G, T, D).transpose(2, 0, 1, 3).reshape(T, hkv * G, D)


def plain_softmax(qh: np.ndarray, kh: np.ndarray, vh: np.ndarray,
                  limits: np.ndarray) -> np.ndarray:
    """softmax(qh kh^T) vh per KV head, one full row of scores at a time.

    qh [h, R, D] (already scaled), kh/vh [h, Tk, D], limits [R] (last visible key per row).
    Returns [h, R, D]. Any leading head count h gives the same bits per head: every step is a
    per-head GEMM, an elementwise op or a reduction along one row."""
    Tk = kh.shape[1]
    s = np.matmul(qh, kh.transpose(0, 2, 1))                         # [h, R, Tk]
    if (limits < Tk - 1).any():
        s[:, np.arange(Tk) > limits[:, None]] = -np.inf              # causal mask
    s -= s.max(axis=-1, keepdims=True)                               # largest logit -> 0
    np.exp(s, out=s)                                                 # p, unnormalised
    l = s.sum(axis=-1, keepdims=True)                                # [h, R, 1]
    out = np.matmul(s, vh)                                           # [h, R, D]
    out /= l          # normalise R*D outputs rather than R*Tk probabilities
    return out


def online_step(qh: np.ndarray, kt: np.ndarray, vt: np.ndarray, hidden: np.ndarray | None,
                m: np.ndarray, l: np.ndarray, acc: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One tile of the online softmax. qh [..., R, D], kt/vt [..., n, D], m/l [..., R, 1],
    acc [..., R, D]; ``hidden`` broadcasts to the scores [..., R, n] (True = masked key).

    The update (Milakov & Gimelshein 2018; FlashAttention): with m' = max(m, max(s)),
        l'   = l * exp(m - m') + sum(exp(s - m'))
        acc' = acc * exp(m - m') + exp(s - m') @ vt
    Masked keys get score -inf, so exp gives exactly 0 and their V rows (which must be finite:
    0 * NaN is NaN) add exactly 0. The first tile always holds key 0, which every row sees, so
    m is finite after it and exp(m - m') never computes inf - inf."""
    s = np.matmul(qh, np.swapaxes(kt, -1, -2))                       # [..., R, n]
    if hidden is not None:
        np.copyto(s, -np.inf, where=hidden)
    m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
    alpha = np.exp(m - m_new)                                        # 0 on the first tile
    s -= m_new
    np.exp(s, out=s)
    l = l * alpha + s.sum(axis=-1, keepdims=True)
    acc = acc * alpha + np.matmul(s, vt)
    return m_new, l, acc


def online_init(shape_rows: tuple[int, ...], D: int, dtype: np.dtype
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Running max (-inf), running sum (0) and accumulator (0) for rows of shape [..., R]."""
    m = np.full((*shape_rows, 1), -np.inf, dtype)
    l = np.zeros((*shape_rows, 1), dtype)
    acc = np.zeros((*shape_rows, D), dtype)
    return m, l, acc


def online_softmax(qh: np.ndarray, kh: np.ndarray, vh: np.ndarray, limits: np.ndarray,
                   tile: int) -> np.ndarray:
    """The same attention as ``plain_softmax`` over tiles of ``tile`` keys (online softmax).

    Every tile is exactly ``tile`` keys wide: the last one is padded with masked keys (K and V
    of zeros), exactly as the paged kernel treats the unfilled tail of a sequence's last block.
    Keeping the tile width fixed keeps every GEMM and every row sum the same shape in the oracle
    and in the paged path, which is what makes bit-for-bit equality possible."""
    h, R, D = qh.shape
    Tk = kh.shape[1]
    m, l, acc = online_init((h, R), D, qh.dtype)
    for j0 in range(0, Tk, tile):  # one iteration per tile of keys (per block when tile == BS)
        kt, vt = kh[:, j0:j0 + tile], vh[:, j0:j0 + tile]            # [h, n, D]
        if kt.shape[1] < tile:                                       # pad the last tile
            pad = ((0, 0), (0, tile - kt.shape[1]), (0, 0))
            kt, vt = np.pad(kt, pad), np.pad(vt, pad)
        keys = np.arange(j0, j0 + tile)
        hidden = keys > limits[:, None]                              # [R, n]
        m, l, acc = online_step(qh, kt, vt, hidden if hidden.any() else None, m, l, acc)
    acc /= l
    return acc


def dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float | None = None,
                    causal: bool = True, tile: int | None = None) -> np.ndarray:
    """Scaled dot-product attention of q over contiguous k, v.

    q [T, H, D]; k, v [Tk, Hkv, D]; returns [T, H, D] in q.dtype.
    scale: default 1/sqrt(D). causal: query t sees keys 0 .. Tk - T + t (requires T <= Tk);
    otherwise every query sees every key. tile: None for the plain softmax, n for the online
    softmax over tiles of n keys (last tile padded with masked keys).
    Accumulates float16 in float32 (result rounded to float16 once); float32 and float64 in
    their own precision. Query head h reads KV head h // (H // Hkv)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
        if x.ndim != 3:
            raise ValueError(f"{name} must be 3-D ({'[T, H, D]' if name == 'q' else '[Tk, Hkv, D]'}"
                             f"), got shape {x.shape}")
        check_dtype(name, x.dtype)
    if k.shape != v.shape:
        raise ValueError(f"k.shape={k.shape} != v.shape={v.shape}; expected both [Tk, Hkv, D]")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}; expected one dtype")
    T, H, D = q.shape
    Tk, Hkv, Dk = k.shape
    if Dk != D:
        raise ValueError(f"head size differs: q.shape[2]={D}, k.shape[2]={Dk}")
    if T < 1 or Tk < 1 or D < 1 or Hkv < 1:
        raise ValueError(f"empty input: q.shape={q.shape}, k.shape={k.shape}; expected T, Tk, "
                         "H, Hkv, D >= 1")
    if H % Hkv:
        raise ValueError(f"H={H} query heads is not a multiple of Hkv={Hkv} KV heads")
    if causal and T > Tk:
        raise ValueError(f"causal attention with T={T} queries needs at least T keys, got Tk={Tk}"
                         " (the queries are the last T of the Tk positions)")
    check_tile(tile)
    check_scale(scale)
    acc = accumulation_dtype(q.dtype)
    qh = _to_heads(q, Hkv, D ** -0.5 if scale is None else scale, acc)   # [Hkv, G*T, D]
    kh = np.ascontiguousarray(k.transpose(1, 0, 2), dtype=acc)           # [Hkv, Tk, D]
    vh = np.ascontiguousarray(v.transpose(1, 0, 2), dtype=acc)
    limits = row_limits(T, Tk, H // Hkv, causal)
    if tile is None:
        oh = plain_softmax(qh, kh, vh, limits)
    else:
        oh = online_softmax(qh, kh, vh, limits, int(tile))
    return _from_heads(oh, T).astype(q.dtype)
