"""A small decoder-only transformer in plain torch: RMSNorm, rotary positions, GQA, SwiGLU.

What it teaches: what the KV cache holds and where it is read. Each layer projects the hidden
states of the new tokens to queries, keys and values; the keys and values are what the paged
cache stores (vLLM paper section 2.1), and attention is the only place a token looks at other
tokens. Everything else (norms, MLP, the output head) works on one token at a time, which is why
an engine can pack the tokens of many sequences into one flat batch of T rows (so does vLLM's
vllm/v1/worker/gpu_model_runner.py) and only attention needs to know which rows belong together.

So the model offers two forward passes:

* ``forward(tokens)``: ordinary causal self-attention over a [B, T] batch, used for training.
* ``forward_packed(tokens, positions, attend)``: T packed tokens from any number of sequences;
  at every layer it hands the new tokens' q, k, v to ``attend(layer, q, k, v)``, a callback that
  stores k and v wherever it keeps its cache and returns the attention output. The reference
  generator (reference.py) passes a callback over a contiguous per-sequence cache, the paged
  engine (engine.py) one that writes pages with reshape_and_cache and reads them with
  paged attention. The model never knows which.

Architecture (Llama-like): token embedding -> n_layers x [RMSNorm -> attention (rotary
positions on q and k, GQA: query head h reads KV head h // (H // Hkv)) -> residual, RMSNorm ->
SwiGLU (or GELU) MLP -> residual] -> RMSNorm -> linear head to vocabulary logits. Switches for
real checkpoints (hf.py), off for the tiny model: ``qkv_bias`` (Qwen2), ``qk_norm`` (Qwen3: an
RMSNorm on each head of q and k before the rotation), ``head_size`` (Qwen3: not dim / H),
``tie_embeddings`` (the head reuses the embedding matrix), ``rope_scaling`` (Llama 3.1+).

Shapes: T tokens, H query heads, Hkv KV heads, D head size, V vocabulary, B batch (training).

Read next: reference.py (the plain generator, the oracle), then engine.py (the paged engine).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minipaged._checks import check_choice, check_int

# attend(layer_index, q [T, H, D], k [T, Hkv, D], v [T, Hkv, D]) -> out [T, H, D]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 100
    dim: int = 64
    n_layers: int = 3
    n_heads: int = 4
    n_kv_heads: int = 2
    hidden_dim: int = 176
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    mlp: str = "swiglu"
    head_size: int = 0                 # 0: dim // n_heads
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    # Llama 3 scaling: (factor, low_freq_factor, high_freq_factor, original_max_positions)
    rope_scaling: tuple | None = None

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim",
                     "max_seq_len"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), low=1))
        if self.head_size == 0 and self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} must be a multiple of n_heads={self.n_heads}")
        if self.rope_scaling is not None and not (len(self.rope_scaling) == 4 and 0 <
                                                  self.rope_scaling[1] < self.rope_scaling[2]):
            raise ValueError(f"rope_scaling must be (factor, low_freq_factor, high_freq_factor "
                             f"> low_freq_factor > 0, original_positions): {self.rope_scaling}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of "
                             f"n_kv_heads={self.n_kv_heads} (GQA groups of equal size)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary positions")
        check_choice("mlp", self.mlp, ("swiglu", "gelu"))

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.n_heads

    def as_dict(self) -> dict:
        return asdict(self)

    def memory_spec(self, num_params: float = 0.0, dtype_bytes: int = 4):
        """This model as a ``sim.memory.ModelSpec``, whose arithmetic sizes its KV pool."""
        from minipaged.sim.memory import ModelSpec

        return ModelSpec("model", self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim,
                         num_params, dtype_bytes, self.max_seq_len)

    def kv_bytes_per_token(self, itemsize: int = 4) -> int:
        """2 (K and V) x layers x KV heads x head size x bytes: what one cached token costs."""
        return self.memory_spec(dtype_bytes=itemsize).kv_bytes_per_token


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without the mean subtraction or bias."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """Rotation speed of each pair of dimensions [D/2]: theta^(-2i/D) (RoFormer, Su et al.), then
    Llama 3's ``rope_scaling`` (Meta's llama-models, models/llama3 ``apply_scaling``): a pair of
    short wavelength 2*pi/freq (< original / high_freq_factor) keeps its speed, a long one
    (> original / low_freq_factor) turns ``factor`` times slower, in between they are blended."""
    freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64)
                              / cfg.head_dim)
    if cfg.rope_scaling is None:
        return freq
    factor, low, high, original = cfg.rope_scaling
    wavelength = 2 * math.pi / freq
    smooth = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)  # 0 slow, 1 fast
    return (1 - smooth) * freq / factor + smooth * freq


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [max_seq_len, D/2]: angle = position * frequency of the pair."""
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float64),
                         rope_frequencies(cfg))
    return torch.cos(angles).float(), torch.sin(angles).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :D/2], x[..., D/2:]) by each token's angles.

    x [T, nh, D] (or [B, T, nh, D]); cos/sin [T, D/2] already indexed by the tokens' positions.
    Rotary positions are why the cache can hold keys *after* rotation: a key's rotation depends
    only on its own position, never on who reads it later, so cached keys stay valid forever."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)  # broadcast heads
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        D = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * D, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * D, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * D, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * D, cfg.dim, bias=False)
        if cfg.qk_norm:            # one RMSNorm over D, shared by all heads of q (and of k)
            self.q_norm = RMSNorm(D, cfg.norm_eps)
            self.k_norm = RMSNorm(D, cfg.norm_eps)

    def qkv(self, x, cos, sin):
        """x [..., T, dim] -> q [..., T, H, D], k and v [..., T, Hkv, D] (q and k rotated)."""
        c, D = self.cfg, self.cfg.head_dim
        q = self.wq(x).unflatten(-1, (c.n_heads, D))
        k = self.wk(x).unflatten(-1, (c.n_kv_heads, D))
        v = self.wv(x).unflatten(-1, (c.n_kv_heads, D))
        if c.qk_norm:              # before the rotation: the cache holds normed, rotated keys
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.kind = cfg.mlp
        self.w_up = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w_down = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        if cfg.mlp == "swiglu":
            self.w_gate = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)

    def forward(self, x):
        if self.kind == "swiglu":
            return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
        return self.w_down(F.gelu(self.w_up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)
        if cfg.tie_embeddings:     # one [V, dim] matrix both embeds tokens and scores them
            self.lm_head.weight = self.tok_emb.weight

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # --- training: ordinary batched causal attention --------------------------------------
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, V]; every row starts at position 0."""
        B, T = tokens.shape
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        group = self.cfg.n_heads // self.cfg.n_kv_heads
        x = self.tok_emb(tokens)                                       # [B, T, dim]
        for layer in self.layers:
            q, k, v = layer.attn.qkv(layer.attn_norm(x), cos, sin)     # [B, T, H|Hkv, D]
            # GQA by repeating each KV head for its group of query heads: query head h reads
            # KV head h // group, the same mapping the paged kernels use.
            k = k.repeat_interleave(group, dim=2)
            v = v.repeat_interleave(group, dim=2)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)
            x = x + layer.attn.wo(o.transpose(1, 2).flatten(-2))
            x = x + layer.mlp(layer.mlp_norm(x))
        return self.lm_head(self.norm(x))

    # --- inference: packed tokens, attention supplied by the caller ------------------------
    @torch.inference_mode()
    def forward_packed(self, tokens: torch.Tensor, positions: torch.Tensor, attend: AttendFn,
                       logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        """T packed new tokens (of any sequences) -> logits [len(logit_rows) or T, V].

        tokens, positions: int64 [T]; positions are each token's index inside its own sequence
        (rotary angles depend on it). ``attend`` sees every layer's new q, k, v and must return
        the attention output [T, H, D]; it is where a cache is written and read.
        ``logit_rows`` picks the rows that need logits (the last token of each sequence)."""
        if int(positions.max()) >= self.cfg.max_seq_len:
            raise ValueError(f"position {int(positions.max())} is beyond the model's "
                             f"max_seq_len={self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]   # [T, D/2]
        x = self.tok_emb(tokens)                                        # [T, dim]
        for i, layer in enumerate(self.layers):
            q, k, v = layer.attn.qkv(layer.attn_norm(x), cos, sin)      # [T, H|Hkv, D]
            o = attend(i, q, k, v)                                      # [T, H, D]
            x = x + layer.attn.wo(o.reshape(o.shape[0], -1))
            x = x + layer.mlp(layer.mlp_norm(x))
        if logit_rows is not None:
            x = x[logit_rows]
        return self.lm_head(self.norm(x))


def scale_for(cfg: ModelConfig) -> float:
    return 1.0 / math.sqrt(cfg.head_dim)
