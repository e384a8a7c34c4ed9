"""harness/run/checks.py: ``check_pairs`` tells a model shape a codec cannot serve (a skip, the run goes on) from
an option value the user gave that the shape cannot take (issue #41: an error, though another codec can run)."""
from __future__ import annotations

import pytest

from harness.run.checks import check_pairs
from harness.run.config import RunConfig, RunError


def test_a_default_the_shape_cannot_take_is_a_skip_a_given_value_an_error():
    config = RunConfig(codecs=["kivi", "polarquant"], bits=[2])
    ok, skipped = check_pairs(config, (2, 2, 8), "head dim 8")  # polarquant's 4 levels: blocks of 16 coordinates
    assert [c.label for c in ok] == ["none", "kivi@2"]
    assert [(s["label"], s["reason"]) for s in skipped] == [
        ("polarquant@2", "polarquant levels must be in 1..3 for head_dim 8 (padded to 8), got 4")]
    given = RunConfig(codecs=["kivi", "polarquant"], bits=[2], codec_options={"polarquant": {"levels": "4"}})
    with pytest.raises(RunError, match=r"^--codec-opt polarquant\.levels=4: polarquant levels must be in 1\.\.3 for "
                                       r"head_dim 8 \(padded to 8\), got 4 \(head dim 8\); give polarquant a value it "
                                       r"takes here, or leave the option out$"):
        check_pairs(given, (2, 2, 8), "head dim 8")
    ok, skipped = check_pairs(given, (2, 2, 64), "head dim 64")
    assert [c.label for c in ok] == ["none", "kivi@2", "polarquant@2"] and skipped == []
