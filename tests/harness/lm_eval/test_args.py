"""kvcodec's model_args beside lm-eval's own HFLM options, and the check of what a finished evaluation
compressed (issue 41)."""
from __future__ import annotations

import inspect

import pytest


def test_every_hflm_option_is_passed_on_or_refused():
    """HFLM_OPTIONS (passed on) and HFLM_LOADING (refused) are read from lm-eval 0.4.13's HFLM.__init__: an
    lm-eval whose HFLM takes a new option fails here, rather than having it dropped in silence."""
    pytest.importorskip("lm_eval.api")
    from lm_eval.models.huggingface import HFLM

    from harness.lm_eval.args import HFLM_LOADING, HFLM_OPTIONS, RUN_FIELDS

    taken = set(inspect.signature(HFLM.__init__).parameters) - {"self", "kwargs"}
    handled = set(HFLM_OPTIONS) | set(HFLM_LOADING) | set(RUN_FIELDS) | {"trust_remote_code"}
    assert taken <= handled, sorted(taken - handled)
    assert not set(HFLM_OPTIONS) & set(HFLM_LOADING)


def test_what_an_evaluation_compressed_is_checked():
    """No rollout committed a token: refused; some did not: a note; none ran at all (every answer from
    lm-eval's cache, or no request): nothing measured, nothing said; the native cache: never."""
    pytest.importorskip("lm_eval.api")
    from harness.lm_eval.model import check_compressed

    summary = {"cache_config": {"codec": "octopus", "residual": 4}, "rollouts_with_committed_tokens": 7,
               "rollouts_without_committed_tokens": 2}
    assert check_compressed(summary).startswith("note: 2 of 9 rollouts committed no token")
    assert check_compressed({**summary, "rollouts_without_committed_tokens": 0}) is None
    with pytest.raises(ValueError, match="none of the 2 rollouts committed a token"):
        check_compressed({**summary, "rollouts_with_committed_tokens": 0})
    assert check_compressed({**summary, "rollouts_with_committed_tokens": 0,
                             "rollouts_without_committed_tokens": 0}) is None
    assert check_compressed({**summary, "cache_config": {"codec": "none", "residual": 4},
                             "rollouts_with_committed_tokens": 0}) is None
