"""A text run's memory, checked before its model loads: the plan (:mod:`harness.run.memory`) of each task's
longest batch against the memory free where the run goes, the prefill chunk the run comes to, the plan in
the run's header, and a run that cannot fit refused in one line (exit code 2) before anything loads.

``--prefill-chunk auto``: prompts up to :data:`harness.run.config.AUTO_WHOLE_PREFILL` tokens are prefilled
in one piece (rows as before chunks existed); a run with longer ones takes the largest power-of-two chunk
(at most that many tokens) whose plan fits the free memory, on the CPU :data:`CPU_CHUNK`. config.json keeps
``auto``; model.json the chunk (``prefill_chunk``), which depends on the machine. Free memory is CUDA's
``mem_get_info`` on the run's GPU (every visible GPU, summed, with ``--device-map auto``) or the CPU's
MemAvailable; where it cannot be read, nothing is refused.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from harness.run.config import AUTO_WHOLE_PREFILL, RunConfig, RunError, batch_size_for
from harness.run.memory import CodecRate, MemoryPlan, ModelShape, TaskShape, plan_lines, plan_memory, refusal

#: ``auto`` on the CPU: a fixed chunk (its RAM is not what limits a CPU run of such a context)
CPU_CHUNK = 4096
#: the chunks ``auto`` tries on a GPU, largest first
GPU_CHUNKS = tuple(2 ** k for k in range(15, 7, -1))


def device_of(config: RunConfig) -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if config.device == "auto" else config.device


def free_bytes(device: str, spread: bool) -> tuple[int | None, str]:
    """(bytes free, where): on the run's GPU (every visible one where ``spread``), or the CPU's available RAM;
    None where it cannot be read."""
    import torch

    if device.startswith("cuda"):
        index = [int(device.partition(":")[2] or 0)] if not spread else list(range(torch.cuda.device_count()))
        free = sum(torch.cuda.mem_get_info(i)[0] for i in index)
        return free, ", ".join(f"cuda:{i}" for i in index)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "the CPU (available RAM)"
    except OSError:
        pass
    return None, "the CPU"


def checkpoint_config(path: str | None) -> dict | None:
    """A checkpoint folder's config.json, or None (no folder, a .gguf file, unreadable)."""
    import json

    f = Path(path) / "config.json" if path else None
    try:
        cfg = json.loads(f.read_text(encoding="utf-8")) if f is not None and f.is_file() else None
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def codec_rates(cache_configs, shape: ModelShape) -> list[CodecRate]:
    """Each compressing configuration's stored bytes per token of a codec layer (its codec's byte formulas,
    built on the CPU for the model's head dim); one it cannot build is left to the run's own checks."""
    from kernels import make_codec

    out = []
    for cc in cache_configs:
        if cc.codec == "none":
            continue
        try:
            codec = make_codec(cc.codec_config(shape.head_dim, shape.kv_heads))
            block = codec.token_block
            kv = (shape.kv_heads, block, shape.head_dim)
            per = (codec.expected_nbytes(kv) + codec.value_quantizer.expected_nbytes(kv)) / block
            native = len(cc.protected_layers(shape.layers)) + shape.sliding
        except (ValueError, TypeError, NotImplementedError):
            continue
        decoded = cc.memo_decoded and (cc.attend == "reconstruct" or not codec.has_score_estimator)
        fused = codec.fused_layout() is not None or codec.token_layout() is not None
        out.append(CodecRate(cc.label, per, max(shape.layers - native, 0), decoded, block, fused))
    return out


class RunPlan:
    """A run's plans at any chunk or batch: ``worst(chunk, batch)`` the plan of the task that peaks highest
    (and that task), each task's longest batch at most ``batch`` prompts (None: as the run has them)."""

    def __init__(self, config: RunConfig, tasks: list[TaskShape], model_config: dict, device: str):
        import torch

        from adapters.loading import resolve_dtype

        self.dtype = resolve_dtype(config.dtype, device)
        self.shape = ModelShape.from_config(model_config)
        self.tasks = tasks
        self.longest = max(t.context for t in tasks)
        self._kw = dict(dtype_bytes=torch.empty(0, dtype=self.dtype).element_size(), residual=config.residual,
                        codecs=codec_rates(config.cache_configs(), self.shape),
                        graphed=device.startswith("cuda") and config.graphs == "auto")

    def worst(self, chunk: int | None, batch: int | None = None) -> tuple[MemoryPlan, TaskShape]:
        plans = [(plan_memory(self.shape, task=t if batch is None else replace(t, batch=min(t.batch, batch)),
                              chunk=chunk, **self._kw), t) for t in self.tasks]
        return max(plans, key=lambda pt: pt[0].peak)

    def chunk(self, option, device: str, free: int | None) -> int | None:
        """``--prefill-chunk`` resolved (module docstring)."""
        if option != "auto":
            return option
        if self.longest <= AUTO_WHOLE_PREFILL:
            return None
        if not device.startswith("cuda"):
            return CPU_CHUNK
        return next((c for c in GPU_CHUNKS if free is None or self.worst(c)[0].peak <= free), GPU_CHUNKS[-1])


def check_memory(config: RunConfig, tasks: list[TaskShape | None], model_config: dict, log=print,
                 device: str | None = None) -> int | None:
    """Plan the run (each task's longest batch), print the plan, refuse what cannot fit; returns the prefill
    chunk (None: one piece). ``model_config``: the checkpoint's config.json as a dict."""
    device = device or device_of(config)
    tasks = [t for t in tasks if t is not None]
    if not tasks:
        log("memory plan: no task states its context in tokens (kvpress.max_context=0): not planned")
        return None if config.prefill_chunk == "auto" else config.prefill_chunk
    free, where = free_bytes(device, config.device_map == "auto")
    run = RunPlan(config, tasks, model_config, device)
    chunk = run.chunk(config.prefill_chunk, device, free)
    plan, task = run.worst(chunk)
    for line in plan_lines(plan, task, str(run.dtype).replace("torch.", ""), free, where):
        log(line)
    if free is not None and plan.peak > free:
        fits = [(f"--prefill-chunk {c}", p) for c in GPU_CHUNKS if c < (plan.chunk or run.longest)
                for p in [run.worst(c)[0]] if p.peak <= free][:1]
        fits += [(f"--batch-size {b}", p) for b in range(task.batch - 1, 0, -1)
                 for p in [run.worst(chunk, b)[0]] if p.peak <= free][:1]
        raise RunError(refusal(plan, free, where, fits, config.device_map == "auto"))
    return chunk


def resolve_chunk(config: RunConfig, tasks: list[TaskShape], model_config: dict, device: str) -> int | None:
    """``--prefill-chunk`` resolved for ``tasks`` without the check (:class:`RunPlan`; lm-eval's model, whose
    requests are not known before they arrive)."""
    if config.prefill_chunk != "auto":
        return config.prefill_chunk
    free, _ = free_bytes(device, config.device_map == "auto")
    return RunPlan(config, tasks, model_config, device).chunk("auto", device, free)


def task_shapes(config: RunConfig, work: list, device: str) -> list[TaskShape | None]:
    """Each text task's longest batch (:meth:`harness.tasks.base.Task.memory_shape`) at the run's batch size."""
    batch = batch_size_for(config.batch_size, device)
    return [task.memory_shape(prompts, batch) for _, task, prompts in work]


def run_memory(config: RunConfig, modality: str, work: list, model=None, log=print):
    """A run's memory check (:func:`check_memory`) from what it has: the checkpoint's config.json before
    the model loads, or a loaded model's own config (``model``). Returns the prefill
    chunk, or ``...`` where nothing says the model's shape yet (a text run is then checked once it loads).
    ``work``: the runner's (task name, task, prompts) per task."""
    if modality != "text":
        return ...
    if model is None:
        model_config = checkpoint_config(config.model_path)
    else:
        model_config = getattr(getattr(model, "model", None), "config", None)
        model_config = model_config.to_dict() if model_config is not None else None
    if model_config is None:
        return ...
    device = str(model.device) if model is not None else device_of(config)
    return check_memory(config, task_shapes(config, work, device), model_config, log, device)
