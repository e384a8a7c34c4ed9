"""What differs between the transformers releases we support, kept in one place.

- The cache keyword. Up to 5.23 a model's ``forward`` and ``generate`` take the cache as
  ``past_key_values=``; from 5.24 as ``cache=`` (the old name is deprecated, with a FutureWarning,
  and is removed from model forwards in 5.40). A model must be called with the name its own
  signature takes: on 5.23, ``model(x, cache=c)`` raises nothing and leaves ``c`` empty.
  :func:`cache_kwargs` picks it; :func:`passed_cache` reads a call's kwargs under either name.
- The tested range (:data:`TESTED`): the suite passes on both ends (``scripts/setup`` installs the
  upper end from ``requirements.lock``; ``scripts/check-latest`` tries the newest release).
  :func:`check_transformers` refuses a release below the floor and warns once, in one line, about
  one newer than the last tested.
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Callable

from packaging.version import Version

from adapters.hf.arch import UnservableModel

#: the oldest and newest transformers releases the whole suite passed on
TESTED = ("5.23.0", "5.24.0")
CACHE_NAMES = ("cache", "past_key_values")  # the new name first: both may exist during the deprecation


class UntestedTransformers(UserWarning):
    """A transformers release newer than the last one our suite passed on."""


def check_transformers(version: str | None = None) -> None:
    """Raise below :data:`TESTED`'s floor; warn once (one line) above its last tested release."""
    if version is None:
        import transformers

        version = transformers.__version__
    _check(version)


@functools.lru_cache(maxsize=None)
def _check(version: str) -> None:  # once per version: attach runs for every rollout
    low, high = TESTED
    if Version(version) < Version(low):
        raise UnservableModel(f"transformers {version} is older than this harness supports (tested {low} to "
                              f"{high}): pip install -c requirements.lock transformers, or bash scripts/setup")
    if Version(version) > Version(high):
        _warn_newer(version)


@functools.lru_cache(maxsize=None)
def _warn_newer(version: str) -> None:
    low, high = TESTED
    warnings.warn(f"transformers {version} is newer than the releases this harness was tested on ({low} to {high}); "
                  f"results may differ (bash scripts/setup installs the tested one)", UntestedTransformers, stacklevel=3)


@functools.lru_cache(maxsize=None)
def cache_keyword(fn: Callable) -> str | None:
    """The keyword under which ``fn`` (a model's ``forward``) takes the KV cache,
    read from its signature (decorators that wrap it keep the signature); None if it names neither."""
    params = inspect.signature(fn).parameters
    return next((name for name in CACHE_NAMES if name in params), None)


def cache_kwargs(model, cache) -> dict:
    """``{keyword: cache}`` for ``model(...)`` and ``model.generate(...)``, under the name the model's
    ``forward`` takes (``generate`` hands its cache on to ``forward`` and, from 5.24, takes it under
    the same new name, though its own signature does not list it)."""
    name = cache_keyword(type(model).forward)
    if name is None:
        raise UnservableModel(f"{type(model).__name__}.forward takes no KV cache (neither 'cache' nor "
                              f"'past_key_values'): the compressed cache cannot serve it")
    return {name: cache}


def passed_cache(kwargs: dict):
    """The cache a forward call was given, under whichever name (None if none)."""
    for name in CACHE_NAMES:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


@functools.lru_cache(maxsize=None)
def _forward_params(model_class: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_class.forward).parameters)


def takes_keyword(model, name: str) -> bool:
    """Whether ``model``'s forward takes keyword ``name`` (e.g. ``logits_to_keep``: most causal LMs)."""
    return name in _forward_params(type(model))
