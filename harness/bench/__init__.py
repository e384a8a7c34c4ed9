"""Benchmarks and probes: ``harness bench`` and ``harness probe``, and what scripts/ measures with.

``harness bench`` is :mod:`.decode`, with :mod:`.encode`, :mod:`.ncu` and :mod:`.report`
(``--generate``: :mod:`.generate`); ``harness probe`` is :mod:`.probe`; the pieces the measurement
scripts in scripts/ build on are :mod:`.inputs` and :mod:`.timing`.

The launchers: :func:`main` (``harness bench ARGS``) and :func:`probe_main` (``harness probe ARGS``),
each taking the command line after the subcommand and returning the exit code.
"""
import importlib

#: the public names, each with the module that holds it (imported on first use: the ncu child and the scripts
#: import one module of the package, not every benchmark and its dependencies)
_EXPORTS = {
    "copies": "decode", "main": "decode",
    "QWEN25_7B": "generate", "TINY": "generate", "cache_makers": "generate", "greedy_generate": "generate",
    "load_model": "generate", "prefilled": "generate", "timed_generate": "generate",
    "SHAPES": "inputs", "parse_ctx": "inputs", "parse_list": "inputs", "random_state": "inputs",
    "real_inputs": "inputs", "triton_path": "inputs",
    "copy_bandwidth": "timing", "device_seconds": "timing", "sdpa_backend_fn": "timing", "time_eager": "timing",
    "time_graph": "timing",
}
_MODULES = ("decode", "encode", "generate", "inputs", "ncu", "probe", "report", "timing")
__all__ = sorted([*_EXPORTS, *_MODULES, "probe_main"])


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "probe_main":
        return importlib.import_module(f"{__name__}.probe").main
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
