"""adapters/hf/compat.py: the cache reaches our hooks under either keyword, a model is called with
the keyword its forward takes, and the transformers version is checked against the tested range."""
from __future__ import annotations

import warnings

import pytest
import torch

from adapters.hf.arch import UnservableModel
from adapters.hf.attach import attach
from adapters.hf.compat import (TESTED, UntestedTransformers, cache_keyword, cache_kwargs, check_transformers,
                                passed_cache)
from adapters.cache.config import CacheConfig
from helpers.tiny_lm import tiny_model

KIVI = CacheConfig(codec="kivi", bits=2, residual=4)


def test_keyword_read_from_the_signature():
    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return past_key_values

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, use_cache=None):
            return cache

    class Neither(torch.nn.Module):
        def forward(self, input_ids=None):
            return input_ids

    assert cache_kwargs(Old(), "c") == {"past_key_values": "c"}
    assert cache_kwargs(New(), "c") == {"cache": "c"}
    assert cache_keyword(Neither.forward) is None
    with pytest.raises(UnservableModel, match="takes no KV cache"):
        cache_kwargs(Neither(), "c")
    assert passed_cache({"past_key_values": 1}) == 1 and passed_cache({"cache": 2}) == 2
    assert passed_cache({"cache": None, "past_key_values": 3}) == 3 and passed_cache({}) is None


def test_the_installed_model_takes_the_keyword_without_a_warning():
    model = tiny_model()
    (name,) = cache_kwargs(model, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation warning on the keyword we pick
        with attach(model) as new_cache:
            cache = new_cache(KIVI)
            model(torch.arange(12)[None], **{name: cache}, use_cache=True)
    assert cache.kv[0].length == 12  # the cache was really used (5.23 ignores an unknown 'cache=')


@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_the_padding_hook_reads_either_keyword(keyword):
    """A left-padded forward with a 2-D mask: the pre-hook finds the cache under either name (the
    model itself may warn about the old one) and the pads never enter the codec's state."""
    model = tiny_model()
    x = torch.tensor([[0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6])
    if keyword not in {cache_keyword(type(model).forward), "past_key_values"}:
        pytest.skip(f"this transformers' forward takes no '{keyword}'")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with attach(model) as new_cache:
            cache = new_cache(KIVI)
            model(x, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True,
                     **{keyword: cache})
    assert cache.kv[0].seq_lengths == [4, 6]


def test_versions_outside_the_tested_range():
    low, high = TESTED
    check_transformers(low)
    check_transformers(high)
    with pytest.raises(UnservableModel, match=f"tested {low} to {high}"):
        check_transformers("5.22.2")
    with pytest.warns(UntestedTransformers, match="newer than the releases this harness was tested on"):
        check_transformers("99.0.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_transformers("99.0.0")  # said once per process, not at every attach
