"""The checks of a run's options against a model's limits and shape, made before the model loads (from what its
checkpoint declares) and again after: :func:`check_limits` (protected layers, the native window, and task and
codec options counted in tokens, against the layers and positions a model has) and :func:`check_pairs` (each
codec built for its heads and head dim). Each option's own range is checked where it is read
(:func:`harness.tasks.base.task_options`, :func:`kernels.config.codec_options`); and :func:`check_modality`, that
a model's modality has metrics."""
from __future__ import annotations

from dataclasses import fields

from adapters.cache.config import CacheConfig, check_protect
from metrics import modalities
from registry.options import OptionError, allowed

from harness.run.config import RunConfig, RunError


def check_limits(config: RunConfig, options: dict[str, type], layers: int | None, positions: int | None,
                 source: str) -> None:
    """The run's options against the model's limits (``source`` says where they were read): protected
    layer indices within its layers, and task options and the codec options the user gave counted in tokens
    within its positions (``options``: each of the run's tasks' ``Options`` class)."""
    if layers is not None:
        try:
            check_protect(config.protect, layers)
        except ValueError as e:
            raise RunError(f"--protect {','.join(map(str, config.protect))}: {e} ({source})") from None
    if positions is not None and any(c.codec != "none" for c in config.cache_configs()):
        check_window(config.residual, positions, source, "--residual ")
    for t in config.tasks:
        for f in fields(options[t]):
            try:
                allowed(f).check_positions(config.task_options.get(t, {}).get(f.name, f.default), positions)
            except ValueError as e:
                raise RunError(f"task option {t}.{f.name}: {e} ({source}); give a shorter context") from None
    codecs = {cc.codec: cc.options for cc in config.cache_configs() if cc.codec in config.codec_options}
    for codec, opts in codecs.items():
        for f in fields(opts):
            if f.name in config.codec_options[codec]:  # a default past them: a codec this model cannot serve
                try:
                    allowed(f).check_positions(getattr(opts, f.name), positions)
                except ValueError as e:
                    raise RunError(f"--codec-opt {codec}.{f.name}: {e} ({source}); give a smaller {f.name}") from None


def check_pairs(config: RunConfig, geometry: tuple[int, int, int], source: str
                ) -> tuple[list[CacheConfig], list[dict]]:
    """The run's cache configurations split into (runnable, skipped with reasons) by building each codec once for
    the model's ``geometry`` (layers, KV heads, head dim; ``source``: where it was read). A codec that cannot
    serve the shape is skipped; an option the user gave that the shape cannot take (the codec's
    :class:`registry.options.OptionError` naming it) is a RunError, as a run where no codec can run is."""
    from kernels import make_codec

    ok, skipped = [], []
    layers, n_kv, head_dim = geometry
    for cc in config.cache_configs():
        if cc.codec == "none":
            ok.append(cc)
            continue
        try:
            make_codec(cc.codec_config(head_dim, n_kv))
            if len(cc.protected_layers(layers)) >= layers:  # --protect, or an engine's own native layers
                raise ValueError(f"every one of the model's {layers} layers stays native (--protect, or the "
                                 f"layers the codec's engine keeps uncompressed): nothing to compress")
            ok.append(cc)
        except (ValueError, TypeError) as e:
            given = config.codec_options.get(cc.codec, {})
            if isinstance(e, OptionError) and e.option in given:  # the user's value, not the codec's default
                raise RunError(f"--codec-opt {cc.codec}.{e.option}={given[e.option]}: {e} ({source}); give "
                               f"{cc.codec} a value it takes here, or leave the option out") from None
            skipped.append({"codec": cc.codec, "bits": cc.bits, "label": cc.label, "reason": str(e)})
    if not any(cc.codec != "none" for cc in ok) and skipped:
        reasons = "; ".join(f"{s['label']}: {s['reason']}" for s in skipped)
        raise RunError(f"no requested codec/bit width can run on this model: {reasons}")
    return ok, skipped


def check_window(residual: int, positions: int, source: str, name: str) -> None:
    """A native window of ``residual`` tokens must leave room for a token to reach the codec in a sequence of the
    model's ``positions``: a larger one compresses nothing, and every row would measure the native cache under
    the codec's name. ``name``: the option as its caller spells it (``--residual `` or ``residual=``)."""
    if residual >= positions:
        raise RunError(f"{name}{residual}: the native window would hold all of the model's {positions} positions, "
                       f"so no token ever reaches the codec ({source}); pass {name.strip()} below {positions}")


def check_modality(spec) -> None:
    """A model's modality must be one a metrics module declares (registry.MODALITIES), and not the probe's."""
    from metrics.registry import REGISTRY as METRICS
    from registry import NO_MODEL

    declared = [m for m in modalities() if m != NO_MODEL]
    if spec.modality not in declared:
        missing = f"; metrics modules not importable here: {METRICS.unavailable}" if METRICS.unavailable else ""
        raise RunError(f"model '{spec.name}' has modality '{spec.modality}', which no metrics module declares "
                       f"(declared: {', '.join(declared)}){missing}")
