"""Test setup. Triton can only run on the CPU through its interpreter, and the variable must be
set before any @triton.jit function is defined, so it is set here, before test modules import."""
import os
import sys

# Tests mirror the source tree (tests/kernels/, tests/adapters/, ...); the helpers they share are the package
# tests/helpers/ (``from helpers.tiny_lm import ...``), importable from every folder's tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Under pytest-xdist each worker gets its share of the cores as threads (scripts/gpu-test does the same): two
# workers of two threads on two cores ran the tiny models 5-30x slower (OpenMP's spinning workers fight). Set
# before torch starts its thread pool, and inherited by the processes a test starts, whose rows are compared
# byte for byte with this process's. An OMP_NUM_THREADS given by the caller wins.
_workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
if _workers:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(_workers))))

try:
    import torch

    _cuda = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "engine_boundaries: keep an engine preset's own native boundary layers")


@pytest.fixture(autouse=True)
def _engine_presets_compress_every_layer(request, monkeypatch):
    """vLLM's TurboQuant presets keep the first and last two layers native, which leaves the 2- and
    3-layer test models uncompressed; the tests of every codec see them compress every layer, and
    tests marked ``engine_boundaries`` (tests/kernels/engines/test_vllm_kv.py) check the boundary itself."""
    if request.node.get_closest_marker("engine_boundaries"):
        return
    from kernels.engines.vllm_turboquant import _VllmTurboQuant

    monkeypatch.setattr(_VllmTurboQuant, "engine_skipped_layers", classmethod(lambda cls, n, options=None: set()))


@pytest.fixture(autouse=True, scope="session")
def _quanto_unpacks_in_torch():
    """optimum-quanto's pure-PyTorch unpacking for every test, not its C++ extension, which it builds on first
    use (a minute on two cores, paid by whichever test first reads a quanto tensor back: tests/helpers/quanto_cpu.py)."""
    from helpers.quanto_cpu import quanto_unpacks_in_torch

    with quanto_unpacks_in_torch():
        yield
