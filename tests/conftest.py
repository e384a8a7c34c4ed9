"""Test setup. Triton can only run on the CPU through its interpreter, and the variable must be
set before any @triton.jit function is defined, so it is set here, before test modules import."""
import os
import sys

# Tests mirror the source tree (tests/kernels/, tests/adapters/, ...); shared helpers such as
# tiny_lm.py sit here, at the top, for every folder's tests to import.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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
