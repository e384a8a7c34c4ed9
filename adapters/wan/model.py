"""A causal Wan 2.1 generator (CausVid, Causal Forcing): block-causal rollout over a compressed KV cache.

Latents are ``[B, C, F, h, w]`` (diffusers' layout; F latent frames, h = H/8, w = W/8). The
transformer patchifies a frame into ``tokens_per_frame = (h/2)(w/2)`` tokens (1560 at 480x832),
so a cache layer holds ``[B, heads, frames * tokens_per_frame, head_dim]``.

Rollout, per block of ``frames_per_block`` latent frames (the released samplers' loop):
  for each timestep t_i: x0 = x - sigma_i * transformer(x, t_i)   (the block attends the cache natively)
                         x  = (1 - sigma_{i+1}) x0 + sigma_{i+1} * noise   (not after the last step)
  commit: run the clean x0 at t = 0; each layer attends, then appends the block's K/V to its LayerKV.
Every noise draw (the initial latents and each re-noising) comes, in a fixed order, from the
generator the caller passes, so a rollout is a function of (prompt, seed) and the cache config.
Block 0 reads nothing but itself, whatever the codec: it is computed once per (prompt, seed) and
every cache configuration starts from it (``share_prefill``; :mod:`adapters.cache.shared_prefill`).
"""
from __future__ import annotations

import html
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from adapters.cache.config import CacheConfig

from adapters.cache.kv_cache import CompressedKVCache
from adapters.protocol import CachePolicy, Geometry, ModelAdapter
from adapters.cache.rollout_clock import OFF, RolloutClock, SharedStep
from adapters.cache.shared_prefill import SharedPrefill
from kernels import private_generator

from adapters.wan.attention import BlockState, causal_attention
from adapters.wan.schedule import FlowSchedule

#: Wan 2.1 T2V 1.3B: 30 blocks of 12 heads x 128 dims.
WAN_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)



def clean_prompt(text: str) -> str:
    """A prompt as Wan's own T5 tokenizer cleans it before encoding: ``ftfy.fix_text`` (mojibake),
    HTML entities unescaped twice (``&amp;amp;`` -> ``&``), whitespace runs collapsed to one space."""
    import ftfy
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return re.sub(r"\s+", " ", text).strip()

@dataclass(frozen=True)
class CausalWanSpec:
    """One causal Wan model: its sampling recipe and the geometry it generates at."""

    name: str
    frames_per_block: int
    schedule: FlowSchedule
    checkpoint_format: str  # "causvid" or "causal-forcing" (see adapters.wan.checkpoint)
    num_frames: int = 21  # latent frames (81 pixel frames)
    height: int = 480
    width: int = 832
    text_len: int = 512
    fps: int = 16
    transformer: dict = field(default_factory=lambda: dict(WAN_1_3B))

    def __post_init__(self):
        if self.num_frames % self.frames_per_block:
            raise ValueError(f"{self.name}: {self.num_frames} latent frames is not a whole number of "
                             f"{self.frames_per_block}-frame blocks")
        if self.height % 16 or self.width % 16:
            raise ValueError(f"{self.name}: height and width must be multiples of 16 (VAE 8x, patch 2x)")

    def to_json(self) -> dict:
        d = asdict(self)
        d["schedule"]["timesteps"] = self.schedule.timesteps().tolist()
        return d


CAUSVID = CausalWanSpec("causvid", 3, FlowSchedule(shift=8.0, steps=(1000, 757, 522)), "causvid")
CAUSAL_FORCING = CausalWanSpec("causal-forcing", 1, FlowSchedule(shift=5.0, steps=(1000, 750, 500, 250), warp=True),
                               "causal-forcing")


@dataclass
class FirstBlock:
    """A rollout's codec-independent start: its noise [1, C, F, h, w], block 0's clean latents
    [1, C, n, h, w], the native cache holding block 0's committed keys/values (empty where the
    video is one block), and the generator's state after block 0's draws."""

    noise: torch.Tensor
    x0: torch.Tensor
    native: CompressedKVCache
    generator_state: torch.Tensor


class CausalWan(ModelAdapter):
    """A loaded causal Wan generator: what ``harness.tasks.video`` drives.

    ``text_encoder`` None means prompts are embedded as seeded random vectors (full-size
    random-weight smoke runs, where the 5.7B UMT5 would only add load time). ``share_prefill``:
    block 0 is computed once per prompt and seed, shared by every cache configuration
    (:mod:`adapters.cache.shared_prefill`; False: through each rollout's own cache).
    """

    modality = "video"

    def __init__(self, spec: CausalWanSpec, transformer, vae, text_encoder=None, tokenizer=None,
                 device="cpu", dtype=torch.float32, source: str = ""):
        self.spec = spec
        self.transformer = transformer.eval().requires_grad_(False)
        self.vae = vae
        self.text_encoder = text_encoder
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.dtype = dtype
        self.source = source  # where the weights came from (a path, or "random init seed ...")
        self._prompt_cache: dict[str, torch.Tensor] = {}
        self.share_prefill = True
        self._shared = SharedPrefill()

    # --- geometry -------------------------------------------------------------------------
    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """(C, F, h, w) of one rollout's latents."""
        c = self.transformer.config
        return c.in_channels, self.spec.num_frames, self.spec.height // 8, self.spec.width // 8

    @property
    def tokens_per_frame(self) -> int:
        _, ph, pw = self.transformer.config.patch_size
        _, _, h, w = self.latent_shape
        return (h // ph) * (w // pw)

    @property
    def num_layers(self) -> int:
        return self.transformer.config.num_layers

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def geometry(self) -> Geometry:
        """The self-attention cache's (the runner checks codecs with it)."""
        c = self.transformer.config
        return Geometry(c.num_layers, c.num_attention_heads, c.attention_head_dim)

    def cache_policy(self, window: int | None = None) -> CachePolicy:
        """The native window counted in latent frames: ``window`` frames (default 1, the paper's) of
        this geometry's tokens, whatever --residual says."""
        if window is None:
            return CachePolicy("token", self.tokens_per_frame,
                               note=(f"`residual_frames` latent frames (task option; default 1 = {self.tokens_per_frame} "
                                     f"tokens; --residual does not apply)"))
        return CachePolicy("token", window * self.tokens_per_frame,
                           note=f"{window} latent frame(s) = {window * self.tokens_per_frame} tokens")

    def new_cache(self, config: CacheConfig, window: int | None = None) -> CompressedKVCache:
        """A cache for one rollout: this model's policy (``window`` latent frames) applied to ``config``."""
        layers, heads, head_dim = self.geometry
        return CompressedKVCache(self.cache_config(config, window), layers, heads, head_dim, device=self.device)

    def describe(self) -> dict:
        layers, heads, head_dim = self.geometry
        return {"name": self.spec.name, "source": self.source, "model_type": "causal wan 2.1", "layers": layers,
                "q_heads": heads, "kv_heads": heads, "head_dim": head_dim,
                "dtype": str(self.dtype).replace("torch.", ""), "device": str(self.device),
                "tokens_per_frame": self.tokens_per_frame,
                "window_note": self.cache_policy().note,
                "spec": self.spec.to_json()}

    # --- text -----------------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompt(self, text: str) -> torch.Tensor:
        """[1, text_len, text_dim] in the model dtype; padding positions are zero (as Wan pads)."""
        if text in self._prompt_cache:
            return self._prompt_cache[text]
        L, D = self.spec.text_len, self.transformer.config.text_dim
        if self.text_encoder is None:
            g = private_generator("wan-random-prompt", text)
            emb = torch.randn(1, L, D, generator=g)
        else:
            tok = self.tokenizer([clean_prompt(text)], max_length=L, padding="max_length", truncation=True,
                                 add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
            ids = tok["input_ids"].to(self.text_encoder.device)
            mask = tok["attention_mask"].to(self.text_encoder.device)
            emb = self.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            emb = emb * mask[..., None].to(emb.dtype)  # zero past the prompt's tokens
        emb = emb.to(self.device, self.dtype)
        self._prompt_cache[text] = emb
        return emb

    # --- rollout --------------------------------------------------------------------------
    def _rotary(self, first_frame: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, frames * tokens_per_frame, 1, d] at frames [first_frame, first_frame + frames)."""
        _, _, h, w = self.latent_shape
        shape_only = torch.empty(1, 1, first_frame + frames, h, w, device="meta")
        cos, sin = self.transformer.rope(shape_only)
        start = first_frame * self.tokens_per_frame
        return cos[:, start:], sin[:, start:]

    def _flow(self, x: torch.Tensor, t: float, prompt_embeds: torch.Tensor) -> torch.Tensor:
        timestep = torch.full((x.shape[0],), float(t), device=self.device, dtype=torch.float32)
        return self.transformer(hidden_states=x, timestep=timestep, encoder_hidden_states=prompt_embeds,
                                return_dict=False)[0]

    def _randn(self, shape, generator: torch.Generator) -> torch.Tensor:
        # drawn on the CPU so a (prompt, seed) gives the same noise on every device
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(self.device, self.dtype)

    @torch.no_grad()
    def rollout(self, prompt_embeds: torch.Tensor, cache: CompressedKVCache, generator: torch.Generator,
                on_block: Callable[[int, dict], None] | None = None,
                speed: RolloutClock | None = None) -> torch.Tensor:
        """Generate one video's latents [1, C, F, h, w] block by block over ``cache``.

        ``on_block(index, info)`` is called after each block with its wall time and the cache's bytes.
        ``speed`` times the first block (into the empty cache) as the prefill and the blocks after it
        as the decode, in latent frames. Block 0 is shared (``share_prefill``: :meth:`_first_block`).
        """
        C, F, h, w = self.latent_shape
        n = self.spec.frames_per_block
        clock = speed or OFF
        clock.start(1, [self.device])
        t0 = time.perf_counter()
        first, shared = self._first_block(prompt_embeds, cache, generator, commit=F // n > 1)
        out = torch.empty_like(first.noise)
        out[:, :, :n] = first.x0
        self._block_done(on_block, 0, t0, cache)
        clock.prefill_done(shared)
        if F // n == 1:  # one block: it is all prefill
            clock.stop()
            return out
        clock.decode_start()
        state = BlockState(cache=cache)
        with causal_attention(self.transformer, state):
            for b in range(1, F // n):
                t0 = time.perf_counter()
                # the last block is never attended to: no commit pass
                out[:, :, b * n:(b + 1) * n] = self._block(state, b, first.noise, generator, prompt_embeds,
                                                           commit=b + 1 < F // n)
                self._block_done(on_block, b, t0, cache)
        clock.decode_done(F - n)
        clock.stop()
        return out

    def _block(self, state: BlockState, b: int, noise: torch.Tensor, generator: torch.Generator,
               prompt_embeds: torch.Tensor, commit: bool) -> torch.Tensor:
        """Block ``b``'s clean latents [1, C, n, h, w]: its timesteps read ``state.cache`` (the block
        attends itself natively), drawing each re-noising from ``generator``; ``commit``: then the
        clean block at t=0, whose self-attention appends its keys/values to the cache."""
        n = self.spec.frames_per_block
        timesteps = self.spec.schedule.timesteps().tolist()
        sigmas = self.spec.schedule.sigmas()
        state.rotary = self._rotary(b * n, n)
        x = noise[:, :, b * n:(b + 1) * n]
        for i, t in enumerate(timesteps):
            state.commit = False
            flow = self._flow(x, t, prompt_embeds)
            x0 = (x.double() - sigmas[i] * flow.double()).to(x.dtype)
            if i + 1 < len(timesteps):
                s = sigmas[i + 1]
                x = ((1 - s) * x0 + s * self._randn(x0.shape, generator)).to(x.dtype)
        if commit:
            state.commit = True
            self._flow(x0, 0.0, prompt_embeds)
            state.commit = False
        return x0

    def _first_block(self, prompt_embeds: torch.Tensor, cache: CompressedKVCache, generator: torch.Generator,
                     commit: bool) -> tuple["FirstBlock", SharedStep | None]:
        """The rollout's noise and block 0, which reads only itself (the cache is empty until it
        commits): computed through ``cache``, or (``share_prefill``) once per (prompt embedding,
        generator state) into a native cache whose keys/values are then appended to ``cache`` (its
        codec encodes them as the commit pass would have), the generator set past block 0's draws.
        Returns (block 0, how it was shared: :class:`SharedStep`, or None where it was computed through ``cache``)."""
        def compute(into: CompressedKVCache) -> FirstBlock:
            C, F, h, w = self.latent_shape
            noise = self._randn((1, C, F, h, w), generator)
            state = BlockState(cache=into)
            with causal_attention(self.transformer, state):
                x0 = self._block(state, 0, noise, generator, prompt_embeds, commit)
            return FirstBlock(noise, x0, into, generator.get_state())

        if not self.share_prefill:
            return compute(cache), None
        key = (prompt_embeds, generator.get_state(), commit)
        first, shared = self._shared.get(key, lambda: compute(self.new_cache(CacheConfig(codec="none"))),
                                         [self.device])
        generator.set_state(first.generator_state)
        cache.replay(first.native)
        return first, shared

    def _block_done(self, on_block, b: int, t0: float, cache: CompressedKVCache) -> None:
        if on_block is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            n = self.spec.frames_per_block
            on_block(b, {"frames": (b * n, (b + 1) * n), "seconds": time.perf_counter() - t0, "cache": cache.nbytes()})

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [1, C, F, h, w] -> frames [T, 3, H, W] float32 on the CPU in [-1, 1] (T = 4(F-1)+1)."""
        vae = self.vae
        mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(1, -1, 1, 1, 1)
        vdev = next(vae.parameters()).device
        vdtype = next(vae.parameters()).dtype
        z = (latents.float().cpu() * std + mean).to(vdev, vdtype)
        video = vae.decode(z, return_dict=False)[0]  # [1, 3, T, H, W]
        if hasattr(vae, "clear_cache"):
            vae.clear_cache()
        return video[0].float().clamp(-1, 1).permute(1, 0, 2, 3).cpu()
