"""A prefill's native layer replayed into a codec layer in pieces (a chunked prefill,
:meth:`adapters.hf.cache.CompressedCache.replay`) leaves exactly the bytes one append leaves: the same
committed states (KIVI's 32-token key groups included), the same native window, the same counts, for one
sequence and for a left-padded batch whose pads fill whole pieces."""
from __future__ import annotations

import pytest
import torch
from helpers.tiny_lm import tiny_model
from transformers.cache_utils import DynamicLayer

from adapters.cache.config import CacheConfig
from adapters.hf.cache import CompressedCache
from kernels import list_codecs

CODECS = ["kivi", "octopus", "turboquant-mse", "qjl", "polarquant", "quarot"]
HKV, D, T = 2, 32, 150  # the tiny model's geometry; 150 tokens: KIVI commits 4 groups of 32 past a window of 8


@pytest.fixture(scope="module")
def config():
    return tiny_model().config


def _native(batch: int, pads: list[int] | None) -> DynamicLayer:
    g = torch.Generator().manual_seed(11)
    k, v = (torch.randn(batch, HKV, T, D, generator=g) for _ in range(2))
    for b, p in enumerate(pads or []):  # pads hold junk a codec must never see
        k[b, :, :p] = v[b, :, :p] = 1e30
    layer = DynamicLayer()
    layer.lazy_initialization(k, v)
    layer.keys, layer.values = k, v
    return layer


def _replayed(config, codec: str, native: DynamicLayer, pads, chunk):
    bits = 2 if 2 in list_codecs()[codec] else list_codecs()[codec][0]
    cache = CompressedCache(config, CacheConfig(codec=codec, bits=bits, residual=8))
    for i in range(len(cache.layers)):
        cache.replay(i, native, pads, chunk)
    return cache.kv[0]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("pads", [None, [0, 70]], ids=["one-length", "padded"])
def test_pieces_leave_the_bytes_of_one_append(config, codec, pads):
    native = _native(1 if pads is None else 2, pads)
    whole = _replayed(config, codec, native, pads, None)
    assert whole.committed > 0 and whole.codec is not None
    for chunk in (7, 32, 50):
        got = _replayed(config, codec, native, pads, chunk)
        assert (got.seq_committed, got.seq_window, got._seen, got.columns, got.padded) == \
            (whole.seq_committed, whole.seq_window, whole._seen, whole.columns, whole.padded)
        for a, b in ((got.compressed_keys(), whole.compressed_keys()), (got.compressed_values(), whole.compressed_values())):
            assert a.shape == b.shape and a.tensors.keys() == b.tensors.keys()
            assert all(torch.equal(a.tensors[f], b.tensors[f]) for f in a.tensors), f"{codec}, chunks of {chunk}"
        for b, n in enumerate(whole.seq_window):  # each sequence's real window tokens (the rest is filler)
            assert torch.equal(got.window_k[b, :, :n], whole.window_k[b, :, :n])
            assert torch.equal(got.window_v[b, :, :n], whole.window_v[b, :, :n])
        assert got.nbytes() == whole.nbytes()
        # the store grown once to the replay's final size (reserve_commits), not by doublings past it
        assert got.store_k._cap == got.store_v._cap == got.committed


def test_a_native_layer_takes_the_whole_tensor(config):
    """Codec 'none' (and protected layers) hold the native keys themselves: nothing to encode, no copy."""
    native = _native(1, None)
    cache = CompressedCache(config, CacheConfig())
    cache.replay(0, native, None, chunk=16)
    assert cache.kv[0].window_k is native.keys and cache.kv[0].columns == T
