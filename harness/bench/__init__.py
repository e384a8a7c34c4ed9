"""Benchmarks and probes: ``harness bench`` (:mod:`.decode`, with :mod:`.encode`, :mod:`.ncu` and
:mod:`.report`; ``--generate``: :mod:`.generate`) and ``harness probe`` (:mod:`.probe`), and the
pieces the measurement scripts in scripts/ build on (:mod:`.inputs`, :mod:`.timing`).

The launchers: :func:`main` (``harness bench ARGS``) and :func:`probe_main` (``harness probe ARGS``),
each taking the command line after the subcommand and returning the exit code.
"""
from . import decode, encode, generate, inputs, ncu, probe, report, timing
from .decode import copies, main
from .generate import QWEN25_7B, TINY, cache_makers, greedy_generate, load_model, prefilled, timed_generate
from .inputs import SHAPES, parse_ctx, parse_list, random_state, real_inputs, triton_path
from .probe import main as probe_main
from .timing import copy_bandwidth, device_seconds, sdpa_backend_fn, time_eager, time_graph

__all__ = [
    "QWEN25_7B", "SHAPES", "TINY", "cache_makers", "copies", "copy_bandwidth", "decode", "device_seconds", "encode",
    "generate", "greedy_generate", "inputs", "load_model", "main", "ncu", "parse_ctx", "parse_list", "prefilled",
    "probe", "probe_main", "random_state", "real_inputs", "report", "sdpa_backend_fn", "time_eager", "time_graph",
    "timed_generate", "timing", "triton_path",
]
