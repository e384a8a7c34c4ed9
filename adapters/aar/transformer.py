"""The AAR transformer: VAR-style next-scale prediction, conditioned on a CLAP audio embedding.

Each step feeds one whole scale (``scales[s]`` tokens) and predicts the codes of that scale;
within a scale tokens attend to each other and to every earlier scale (block-causal), so the KV
cache grows by one scale per step. Blocks are AdaLN transformer blocks: the condition ``c``
(the start token, made from the CLAP embedding by a 2-layer MLP) sets per-block scale, shift
and gate of both sublayers. Attention is cosine attention: queries and keys are L2-normalised,
queries scaled per head by ``exp(min(scale_mul_1H11, log 100))``, softmax scale 1; the cache
therefore holds the normalised keys.

Module and key names follow the released AAR (``model_state_dict``, itself VAR's layout):
``word_embed``, ``class_emb.fc{1,2}``, ``uncond_embedding``, ``pos_start``, ``pos_1LC``,
``lvl_embed``, ``blocks.{i}.attn.{mat_qkv,q_bias,v_bias,zero_k_bias,scale_mul_1H11,proj}``,
``blocks.{i}.ffn.fc{1,2}``, ``blocks.{i}.ada_lin.1``, ``head_nm.ada_lin.1``, ``head``, and the
buffers ``lvl_1L`` and ``attn_bias_for_masking``.
Shapes: x ``[B, L, C]``; q, k, v ``[B, H, L, d]``; condition ``[B, D]``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from adapters.aar.sat import AAR_SCALES

MAX_LOG_SCALE = math.log(100.0)


@dataclass
class AARConfig:
    depth: int = 16
    width: int = 1024  # C (= cond dim D)
    num_heads: int = 16  # head dim 64
    mlp_ratio: float = 4.0
    cond_in: int = 512  # CLAP embedding
    vocab: int = 1024  # SAT codebook size
    latent_dim: int = 128  # SAT code vector size (Cvae)
    scales: tuple[int, ...] = AAR_SCALES
    norm_eps: float = 1e-6

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def num_tokens(self) -> int:
        return sum(self.scales)


class CondMLP(nn.Module):
    """CLAP embedding [B, cond_in] -> condition / start token [B, C] (no biases)."""

    def __init__(self, cin: int, width: int):
        super().__init__()
        self.fc1 = nn.Linear(cin, width, bias=False)
        self.fc2 = nn.Linear(width, width, bias=False)

    def forward(self, e):
        return self.fc2(F.gelu(self.fc1(e), approximate="tanh"))


class FFN(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CosineSelfAttention(nn.Module):
    def __init__(self, width: int, num_heads: int):
        super().__init__()
        self.H, self.d = num_heads, width // num_heads
        self.mat_qkv = nn.Linear(width, 3 * width, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(width))
        self.v_bias = nn.Parameter(torch.zeros(width))
        self.register_buffer("zero_k_bias", torch.zeros(width))
        self.scale_mul_1H11 = nn.Parameter(torch.full((1, num_heads, 1, 1), 4.0).log())
        self.proj = nn.Linear(width, width)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, L, C] -> q (normalised, per-head scaled), k (normalised), v: each [B, H, L, d]."""
        B, L, _ = x.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        q, k, v = F.linear(x, self.mat_qkv.weight, bias).view(B, L, 3, self.H, self.d).permute(2, 0, 3, 1, 4)
        q = F.normalize(q, dim=-1) * self.scale_mul_1H11.clamp_max(MAX_LOG_SCALE).exp()
        return q, F.normalize(k, dim=-1), v

    def forward(self, x: torch.Tensor, layer_kv) -> torch.Tensor:
        """Append this scale's keys/values to ``layer_kv`` (a :class:`adapters.cache.kv_cache.LayerKV`), then
        attend over every cached scale (this one included, native in the residual window)."""
        B, L, C = x.shape
        q, k, v = self.qkv(x)
        layer_kv.append(k, v)
        o = layer_kv.attend(q, scale=1.0)  # [B, H, L, d]
        return self.proj(o.transpose(1, 2).reshape(B, L, C))

    def forward_masked(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Whole-sequence attention with an additive mask [1, 1, L, L] (the training path; tests)."""
        B, L, C = x.shape
        q, k, v = self.qkv(x)
        p = torch.softmax(q.float() @ k.float().transpose(-1, -2) + bias, -1)
        return self.proj((p @ v.float()).to(x.dtype).transpose(1, 2).reshape(B, L, C))


class AdaLNBlock(nn.Module):
    def __init__(self, width: int, num_heads: int, mlp_ratio: float, eps: float):
        super().__init__()
        self.C = width
        self.attn = CosineSelfAttention(width, num_heads)
        self.ffn = FFN(width, round(width * mlp_ratio))
        self.ln_wo_grad = nn.LayerNorm(width, eps=eps, elementwise_affine=False)
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))

    def forward(self, x: torch.Tensor, cond: torch.Tensor, layer_kv=None, bias=None) -> torch.Tensor:
        g1, g2, s1, s2, b1, b2 = self.ada_lin(cond).view(-1, 1, 6, self.C).unbind(2)  # each [B, 1, C]
        h = self.ln_wo_grad(x) * (s1 + 1) + b1
        h = self.attn(h, layer_kv) if layer_kv is not None else self.attn.forward_masked(h, bias)
        x = x + h * g1
        return x + self.ffn(self.ln_wo_grad(x) * (s2 + 1) + b2) * g2


class AdaLNHead(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.C = width
        self.ln_wo_grad = nn.LayerNorm(width, eps=eps, elementwise_affine=False)
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x, cond):
        scale, shift = self.ada_lin(cond).view(-1, 1, 2, self.C).unbind(2)
        return self.ln_wo_grad(x) * (scale + 1) + shift


class AARTransformer(nn.Module):
    def __init__(self, cfg: AARConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or AARConfig()
        C, L = cfg.width, cfg.num_tokens
        std = math.sqrt(1 / (3 * C))
        self.word_embed = nn.Linear(cfg.latent_dim, C)
        self.class_emb = CondMLP(cfg.cond_in, C)
        self.register_buffer("uncond_embedding", torch.randn(1, cfg.cond_in) / math.sqrt(cfg.cond_in))
        self.pos_start = nn.Parameter(torch.randn(1, cfg.scales[0], C) * std)
        self.pos_1LC = nn.Parameter(torch.randn(1, L, C) * std)
        self.lvl_embed = nn.Embedding(len(cfg.scales), C)
        self.blocks = nn.ModuleList([AdaLNBlock(C, cfg.num_heads, cfg.mlp_ratio, cfg.norm_eps)
                                     for _ in range(cfg.depth)])
        self.head_nm = AdaLNHead(C, cfg.norm_eps)
        self.head = nn.Linear(C, cfg.vocab)
        lvl = torch.cat([torch.full((pn,), i) for i, pn in enumerate(cfg.scales)])
        self.register_buffer("lvl_1L", lvl.view(1, L))
        block_causal = torch.where(lvl.view(L, 1) >= lvl.view(1, L), 0.0, -torch.inf)
        self.register_buffer("attn_bias_for_masking", block_causal.view(1, 1, L, L))
        self.begin = [sum(cfg.scales[:i]) for i in range(len(cfg.scales))]

    # --- pieces the rollout calls ----------------------------------------------------------
    def condition(self, emb: torch.Tensor) -> torch.Tensor:
        """CLAP embeddings [B, cond_in] -> condition [2B, C]: conditional rows, then unconditional."""
        uncond = self.uncond_embedding.to(emb.dtype).expand(emb.shape[0], -1)
        return self.class_emb(torch.cat((emb, uncond), 0))

    def level_pos(self) -> torch.Tensor:
        """Level + absolute position embedding [1, L, C]."""
        return self.lvl_embed(self.lvl_1L) + self.pos_1LC

    def first_input(self, cond: torch.Tensor) -> torch.Tensor:
        """Scale 0's input [2B, scales[0], C]: the start token plus its position."""
        n = self.cfg.scales[0]
        return cond.unsqueeze(1).expand(-1, n, -1) + self.pos_start + self.level_pos()[:, :n]

    def scale_input(self, si: int, x_in: torch.Tensor) -> torch.Tensor:
        """Scale si's input from the downsampled f_hat [B', scales[si], latent_dim] -> [B', scales[si], C]."""
        b = self.begin[si]
        return self.word_embed(x_in) + self.level_pos()[:, b:b + self.cfg.scales[si]]

    def step(self, x: torch.Tensor, cond: torch.Tensor, cache) -> torch.Tensor:
        """One scale through every block with the KV cache -> logits [B', l, V] (float32)."""
        for i, block in enumerate(self.blocks):
            x = block(x, cond, layer_kv=cache[i])
        return self.head(self.head_nm(x, cond)).float()

    def forward_masked(self, x_BLC: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Whole-pyramid teacher-forced forward (training layout; for tests): x [B, L, C] -> logits [B, L, V]."""
        L = x_BLC.shape[1]
        bias = self.attn_bias_for_masking[:, :, :L, :L]
        x = x_BLC
        for block in self.blocks:
            x = block(x, cond, bias=bias)
        return self.head(self.head_nm(x, cond)).float()

    @torch.no_grad()
    def init_random(self, generator: torch.Generator) -> "AARTransformer":
        """Seeded random weights shaped like a trained model's (VAR's init recipe, head left unshrunk
        so that random logits are not flat)."""
        std = math.sqrt(1 / (3 * self.cfg.width))
        for name, p in self.named_parameters():
            if name.endswith("scale_mul_1H11"):
                continue
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=generator).clamp_(-2, 2) * std)
            else:
                p.zero_()
        self.uncond_embedding.copy_(torch.randn(self.uncond_embedding.shape, generator=generator)
                                    / math.sqrt(self.cfg.cond_in))
        depth = len(self.blocks)
        for b in self.blocks:
            b.attn.proj.weight.div_(math.sqrt(2 * depth))
            b.ffn.fc2.weight.div_(math.sqrt(2 * depth))
            w = b.ada_lin[1].weight  # rows: gamma1, gamma2 | scale1, scale2, shift1, shift2
            w[2 * self.cfg.width:].mul_(0.5)
            b.ada_lin[1].bias[: 2 * self.cfg.width].fill_(1.0)  # unit gates so residual branches matter
        self.head_nm.ada_lin[1].weight.mul_(0.5)
        return self
