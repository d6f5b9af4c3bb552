"""Dense attention: the oracle every paged path in this project is checked against.

What this teaches (lesson 01): scaled dot-product attention as a decoder runs it. Causal with an
offset: the T new queries are the last T of Tk positions, so query t sees keys ``0 .. Tk - T + t``
(prefill T == Tk, decode T == 1). Grouped-query attention: query head h reads KV head
``h // (H // Hkv)``. The online softmax (``tile=n``, ``online_step``): tiles of n keys, a running
max and sum, as in FlashAttention (not vLLM's paged kernel: csrc/attention/attention_kernels.cuh).

Floating-point sums depend on their order, and NumPy's order on the shapes, so the oracle is three
small kernels over head-major arrays (``_to_heads``, ``plain_softmax``, ``online_softmax``) that
``paged_attention.py`` calls with the same per-head shapes: it equals this oracle bit for bit, and
only where K and V come from changes (vLLM paper, section 4.1).

Read before: nothing (start here). Read next: ``contiguous/usage.py`` (stage 2, lesson 02).
"""

from __future__ import annotations

import numpy as np

from minipaged._checks import SIZE_LIMIT, check_bool, check_dtype


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """float16 accumulates in float32 (rounded once, at the end); float32/64 in themselves."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def check_tile(tile: int | None) -> None:
    if tile is not None and (isinstance(tile, bool) or not isinstance(tile, (int, np.integer))
                             or not 1 <= tile < SIZE_LIMIT):
        raise ValueError(f"tile={tile!r} must be None (plain softmax) or an int in [1, 2**31) "
                         "(online softmax over tiles of that many keys)")


def check_scale(scale: float | None) -> None:
    numbers = (int, float, np.floating, np.integer)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers)
                              or not np.isfinite(scale)):
        raise ValueError(f"scale={scale!r} must be None (1/sqrt(D)) or a finite number")


def row_limits(T: int, Tk: int, G: int, causal: bool) -> np.ndarray:
    """The last key each score row may see, rows ordered (g, t): [G*T] int64. Every row sees
    at least key 0 (T <= Tk), so no softmax row is ever empty."""
    last = np.arange(Tk - T, Tk, dtype=np.int64) if causal else np.full(T, Tk - 1, np.int64)
    return np.tile(last, G)


def _to_heads(q: np.ndarray, num_kv_heads: int, scale: float, acc: np.dtype) -> np.ndarray:
    """q [T, H, D] -> scaled qh [Hkv, G*T, D] in the accumulation dtype, rows ordered (g, t):
    the G query heads of one KV head are the rows of one matrix (one GEMM per KV head)."""
    T, H, D = q.shape
    G = H // num_kv_heads
    qh = q.astype(acc).reshape(T, num_kv_heads, G, D).transpose(1, 2, 0, 3)  # [Hkv, G, T, D]
    qh = np.ascontiguousarray(qh).reshape(num_kv_heads, G * T, D)
    with np.errstate(over="ignore"):
        factor = np.asarray(scale, dtype=acc)
    if not np.isfinite(factor):
        raise ValueError(f"scale={scale!r} overflows {acc} (the accumulation dtype)")
    qh *= factor
    return qh


def _from_heads(oh: np.ndarray, T: int) -> np.ndarray:
    """oh [Hkv, G*T, D] -> [T, H, D] with h = kv_head * G + g (the inverse of ``_to_heads``)."""
    hkv, rows, D = oh.shape
    G = rows // T
    return oh.reshape(hkv, G, T, D).transpose(2, 0, 1, 3).reshape(T, hkv * G, D)


def plain_softmax(qh: np.ndarray, kh: np.ndarray, vh: np.ndarray,
                  limits: np.ndarray) -> np.ndarray:
    """softmax(qh kh^T) vh per KV head, one full row of scores at a time: qh [h, R, D] (scaled),
    kh/vh [h, Tk, D], limits [R] -> [h, R, D]. Every step is per head, so any h gives the same
    bits per head."""
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

    With m' = max(m, max(s)) (Milakov & Gimelshein 2018; FlashAttention):
        l' = l * exp(m - m') + sum(exp(s - m'))      acc' = acc * exp(m - m') + exp(s - m') @ vt
    A masked key scores -inf, so it adds exactly 0 (its V rows must be finite: 0 * NaN is NaN).
    The first tile holds key 0, which every row sees, so m is finite from then on."""
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
    """``plain_softmax`` over tiles of ``tile`` keys. The last tile is padded with masked zero
    keys, as the paged kernel treats a last block's unfilled tail: every GEMM and row sum keeps
    one shape in the oracle and the paged path, which makes bit-for-bit equality possible."""
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
    """Scaled dot-product attention of q [T, H, D] over contiguous k, v [Tk, Hkv, D]; returns
    [T, H, D] in q.dtype. scale: default 1/sqrt(D). causal: query t sees keys 0 .. Tk - T + t
    (T <= Tk), else every key. tile: None for the plain softmax, n for the online softmax."""
    for name, x, dims in (("q", q, "T, H, D"), ("k", k, "Tk, Hkv, D"), ("v", v, "Tk, Hkv, D")):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
        if x.ndim != 3:
            raise ValueError(f"{name} must be 3-D ([{dims}]), got shape {x.shape}")
        check_dtype(f"{name}.dtype", x.dtype)
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
    if check_bool("causal", causal) and T > Tk:
        raise ValueError(f"causal attention with T={T} queries needs at least T keys, got Tk={Tk}"
                         " (the queries are the last T of the Tk positions)")
    check_tile(tile)
    check_scale(scale)
    acc = accumulation_dtype(q.dtype)
    qh = _to_heads(q, Hkv, D ** -0.5 if scale is None else scale, acc)   # [Hkv, G*T, D]
    kh = np.ascontiguousarray(k.transpose(1, 0, 2), dtype=acc)           # [Hkv, Tk, D]
    vh = np.ascontiguousarray(v.transpose(1, 0, 2), dtype=acc)
    limits = row_limits(T, Tk, H // Hkv, causal)
    oh = (plain_softmax(qh, kh, vh, limits) if tile is None
          else online_softmax(qh, kh, vh, limits, int(tile)))
    return _from_heads(oh, T).astype(q.dtype)
