"""One AAR rollout, scale by scale, with the KV cache behind :class:`adapters.cache.kv_cache.CompressedKVCache`.

The batch is 2B rows (conditional, then unconditional) for classifier-free guidance with a
linearly ramped scale: at scale s of S, ``t = cfg * s / (S - 1)`` and the guided logits are
``(1 + t) * logits[:B] - t * logits[B:]``. Tokens are drawn with top-k / top-p from a private
seeded generator. The cache keeps the scale being predicted native (``residual_unit='append'``,
``residual=1``): every earlier scale is held only as codec states, encoded once as it leaves.

Several clips in one rollout (B > 1, one generator per clip): each clip's tokens are drawn from its own
generator over its own guided logits, so each clip's rollout is the one it gets alone to float rounding (a
matmul over several clips' rows rounds otherwise than over one clip's, on the CPU as on a GPU: the tests
check its logits to that rounding and its draws equal where no draw sits on a rounding's edge); the batch
keeps a GPU busy where one clip's few hundred tokens cannot.

Shapes: CLAP embedding ``[B, 512]``; tokens of scale s ``[B, scales[s]]``; guided logits
``[B, scales[s], V]``; f_hat ``[B, latent_dim, F]``; audio ``[B, F * hop]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from adapters.cache.config import CacheConfig

from adapters.cache.kv_cache import CompressedKVCache
from adapters.protocol import CachePolicy, Geometry, ModelAdapter
from adapters.cache.rollout_clock import OFF, RolloutClock
from adapters.cache.shared_prefill import SharedPrefill

from adapters.aar.sat import SAT
from adapters.aar.transformer import AARTransformer


def sample_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """logits [B, l, V] -> sampled ids [B, l]. top_k > 0 keeps the k largest (ties kept); top_p > 0
    keeps the smallest top set whose probability reaches top_p; one multinomial draw per token."""
    B, l, V = logits.shape
    x = logits.float().clone()
    if top_k > 0:
        kth = x.topk(min(top_k, V), dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p > 0:
        srt, order = x.sort(dim=-1)  # ascending
        drop = srt.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1] = False  # the most likely token always stays
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = x.softmax(-1).reshape(-1, V)
    return torch.multinomial(probs, 1, replacement=True, generator=generator).view(B, l)


def _sample(guided: torch.Tensor, s: "SamplingConfig", generator) -> torch.Tensor:
    """Tokens [B, l] from guided logits [B, l, V]: one generator for the batch, or clip b's rows from its own."""
    if not isinstance(generator, (list, tuple)):
        return sample_top_k_top_p(guided, s.top_k, s.top_p, generator)
    return torch.cat([sample_top_k_top_p(guided[b:b + 1], s.top_k, s.top_p, g) for b, g in enumerate(generator)])


@dataclass
class Rollout:
    tokens: list[torch.Tensor]  # per scale [B, scales[s]] int64, CPU
    logits: list[torch.Tensor]  # per scale guided logits [B, scales[s], V] float32, CPU
    f_hat: torch.Tensor  # [B, latent_dim, F] float32, CPU
    audio: torch.Tensor  # [B, F * hop] float32, CPU
    #: the cache after the last scale (its config is the one the rollout used); None once dropped
    #: (a baseline kept for later rows needs only its outputs)
    cache: CompressedKVCache | None = field(default=None, repr=False)

    def clip(self, b: int) -> "Rollout":
        """Clip ``b`` of a batched rollout, as the rollout of that clip alone (the cache left out)."""
        return Rollout([t[b:b + 1] for t in self.tokens], [x[b:b + 1] for x in self.logits], self.f_hat[b:b + 1],
                       None if self.audio is None else self.audio[b:b + 1])


@dataclass
class SamplingConfig:
    cfg: float = 4.0  # guidance at the last scale (the release's default)
    top_k: int = 200
    top_p: float = 0.95


class AARPipeline(ModelAdapter):
    """What the 'aar*' model loaders return and the audio task drives."""

    modality = "audio"

    def __init__(self, aar: AARTransformer, sat: SAT, conditioner, device="cpu", dtype=torch.float32,
                 name: str = "aar", weights: str = ""):
        self.aar = aar.to(device=device, dtype=dtype).eval()
        self.sat = sat.to(device=device, dtype=torch.float32).eval()  # tokenizer and f_hat stay float32
        self.conditioner = conditioner
        self.device, self.dtype, self.name = torch.device(device), dtype, name
        self.weights = weights  # "random (seeded)" or the checkpoint files, for reports
        #: scale 0 computed once per conditioning embedding, shared by every cache configuration
        #: (:meth:`_first_scale`; False: through each rollout's own cache)
        self.share_prefill = True
        self._shared = SharedPrefill()
        if aar.cfg.latent_dim != sat.cfg.latent_dim or aar.cfg.vocab != sat.cfg.codebook_size \
                or tuple(aar.cfg.scales) != tuple(sat.cfg.scales):
            raise ValueError(f"AAR (latent {aar.cfg.latent_dim}, vocab {aar.cfg.vocab}, scales {aar.cfg.scales}) "
                             f"does not fit the tokenizer (latent {sat.cfg.latent_dim}, codebook "
                             f"{sat.cfg.codebook_size}, scales {sat.cfg.scales})")

    @property
    def sample_rate(self) -> int:
        return self.sat.cfg.sample_rate

    @property
    def geometry(self) -> Geometry:
        """The cached self-attention's (the runner checks codecs with it)."""
        c = self.aar.cfg
        return Geometry(c.depth, c.num_heads, c.head_dim)

    def cache_policy(self, window: int | None = None) -> CachePolicy:
        """The paper's recipe: one native scale (``window`` scales), whatever --residual says; the
        run's value groups and protected layers."""
        if window is None:
            return CachePolicy("append", 1, note="one native scale (the scale being predicted; each earlier scale "
                                                 "is encoded once when the next arrives), whatever --residual says")
        return CachePolicy("append", window, note=f"the last {window} scale(s), whatever --residual says")

    @property
    def conditioning_label(self) -> str:
        return self.conditioner.label

    def describe(self) -> dict:
        """model.json's entry; the report's header line reads model_type, layers, heads, dtype, source."""
        c = self.aar.cfg
        return {"name": self.name, "model_type": "AAR next-scale audio", "layers": c.depth, "q_heads": c.num_heads,
                "kv_heads": c.num_heads, "head_dim": c.head_dim, "dtype": str(self.dtype).replace("torch.", ""),
                "device": str(self.device), "source": f"weights {self.weights}; conditioning {self.conditioning_label}",
                "weights": self.weights, "conditioning": self.conditioning_label,
                "cache_window": self.cache_policy().note,
                "aar": c.to_json(), "sat": self.sat.cfg.to_json()}

    def embed(self, audio_48k) -> torch.Tensor:
        """A mono clip at 48 kHz -> conditioning embedding [1, cond_in]."""
        return self.conditioner(audio_48k)

    def new_cache(self, config: CacheConfig) -> CompressedKVCache:
        """A cache for one rollout: this model's policy applied to ``config``."""
        layers, heads, head_dim = self.geometry
        return CompressedKVCache(self.cache_config(config), layers, heads, head_dim, device=self.device)

    @torch.no_grad()
    def rollout(self, emb: torch.Tensor, config: CacheConfig,
                generator: torch.Generator | list[torch.Generator] | None = None,
                sampling: SamplingConfig | None = None, teacher: list[torch.Tensor] | None = None,
                speed: RolloutClock | None = None) -> Rollout:
        """Generate one pyramid per row of ``emb`` [B, cond_in] (or, with ``teacher`` tokens, score it
        teacher-forced: the given tokens are fed instead of sampled ones and no random number is drawn).
        ``generator``: one for the batch, or one per clip (each clip then draws as it does alone). ``speed``
        times the first scale (into the empty cache) as the prefill and the scales after it as the decode,
        in tokens of the B sequences (guidance's unconditional rows not counted)."""
        if teacher is None and generator is None:
            raise ValueError("a free-running rollout needs a generator (kernels.private_generator)")
        if isinstance(generator, (list, tuple)) and len(generator) != emb.shape[0]:
            raise ValueError(f"{len(generator)} generators for a batch of {emb.shape[0]} clips: one per clip")
        s = sampling or SamplingConfig()
        aar, vq, scales = self.aar, self.sat.vq, self.aar.cfg.scales
        S, B = len(scales), emb.shape[0]
        cache = self.new_cache(config)
        clock = speed or OFF
        clock.start(B, [self.device])
        cond, logits, shared = self._first_scale(emb.to(self.device, self.dtype), cache)
        f_hat = torch.zeros(B, vq.dim, scales[-1], device=self.device)
        tokens, logits_out = [], []
        x = None  # the next scale's input, made at the end of each scale
        for si in range(S):
            if si == 1:
                clock.prefill_done(shared)
                clock.decode_start()
            if si > 0:
                logits = aar.step(x, cond, cache)  # [2B, l, V]
            t = s.cfg * si / (S - 1)
            guided = (1 + t) * logits[:B] - t * logits[B:]
            idx = teacher[si].to(self.device) if teacher is not None else _sample(guided, s, generator)
            tokens.append(idx.cpu())
            logits_out.append(guided.cpu())
            f_hat, nxt = vq.next_input(si, f_hat, vq.layers[si].lookup(idx))
            if si < S - 1:
                x = aar.scale_input(si + 1, nxt.transpose(1, 2).to(self.dtype)).repeat(2, 1, 1)
        if S == 1:
            clock.prefill_done(shared)
        else:
            clock.decode_done(B * sum(scales[1:]))
        clock.stop()
        audio = None if teacher is not None else self.sat.fhat_to_audio(f_hat)[:, 0].float().cpu()
        return Rollout(tokens, logits_out, f_hat.float().cpu(), audio, cache)

    def _first_scale(self, emb: torch.Tensor, cache: CompressedKVCache
                     ) -> tuple[torch.Tensor, torch.Tensor, float | None]:
        """The condition [2B, C] and scale 0's logits [2B, scales[0], V] (float32), its keys/values
        appended to ``cache``, and the seconds a replayed scale took when computed (else None).

        Scale 0 reads only itself: the cache keeps it native until scale 1 arrives (one native
        append), so its logits are the same whatever the codec. With ``share_prefill`` it is
        computed once per embedding into a native cache and appended to each rollout's
        (:mod:`adapters.cache.shared_prefill`); sampling stays in the rollout, so every draw is unchanged."""
        def compute(into: CompressedKVCache) -> tuple[torch.Tensor, torch.Tensor, CompressedKVCache]:
            cond = self.aar.condition(emb)
            return cond, self.aar.step(self.aar.first_input(cond), cond, into), into

        c = cache.config
        if not (self.share_prefill and c.residual_unit == "append" and c.residual >= 1):
            return *compute(cache)[:2], None
        (cond, logits, native), shared = self._shared.get(
            (emb,), lambda: compute(self.new_cache(CacheConfig(codec="none"))), [self.device])
        cache.replay(native)
        return cond, logits, shared

    @torch.no_grad()
    def masked_forward_logits(self, emb: torch.Tensor, tokens: list[torch.Tensor],
                              sampling: SamplingConfig | None = None) -> list[torch.Tensor]:
        """Uncached whole-pyramid forward with the training-time block-causal mask (the reference the
        cached rollout is tested against): guided logits per scale for the pyramid ``tokens``."""
        s = sampling or SamplingConfig()
        aar, vq, scales = self.aar, self.sat.vq, self.aar.cfg.scales
        S, B = len(scales), emb.shape[0]
        cond = aar.condition(emb.to(self.device, self.dtype))
        xs = [aar.first_input(cond)]
        f_hat = torch.zeros(B, vq.dim, scales[-1], device=self.device)
        for si in range(S - 1):
            f_hat, nxt = vq.next_input(si, f_hat, vq.layers[si].lookup(tokens[si].to(self.device)))
            xs.append(aar.scale_input(si + 1, nxt.transpose(1, 2).to(self.dtype)).repeat(2, 1, 1))
        logits = aar.forward_masked(torch.cat(xs, 1), cond)
        out = []
        for si, (b, pn) in enumerate(zip(aar.begin, scales)):
            t = s.cfg * si / (S - 1)
            out.append(((1 + t) * logits[:B, b:b + pn] - t * logits[B:, b:b + pn]).cpu())
        return out
