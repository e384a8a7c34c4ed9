"""The synthetic probe (`harness probe`): outputs, rate accounting, determinism, matched-rate table."""
import json
import math

import pytest
import torch

from harness.bench.probe import NEEDLE_KEYS, NEEDLE_NOISE, NEEDLE_QUERIES, main, matched_rate, run
from kernels import private_generator
from helpers.tolerances import U64, exp_rel, gamma, sum_rel


def test_matched_rate_interpolates_log_linearly():
    table = [{"codec": "a", "true_bits": 2.0, "unit_mse": 0.1},
             {"codec": "a", "true_bits": 3.0, "unit_mse": 0.025}]
    got = matched_rate(table, [1.5, 2.5, 3.0])["a"]
    assert got["1.5"] is None  # outside the measured range: never extrapolated
    # float64 log-linear interpolation (a log, an exp, a few products): approx's default rel is far above
    assert got["2.5"] == pytest.approx(math.sqrt(0.1 * 0.025))
    assert got["3"] == pytest.approx(0.025)


def test_probe_end_to_end(tmp_path):
    codecs = ["turboquant-mse", "octopus", "kivi", "qjl"]
    res = run(dim=64, bits=(2, 3), n=256, seeds=1, codecs=codecs, out=tmp_path, progress=False)
    for f in ("probe.json", "report.md", "rate_distortion.png"):
        assert (tmp_path / f).stat().st_size > 0
    table = res["table"]
    # reference for the needle row: the probe's documented protocol (NEEDLE_KEYS Gaussian keys, one of them the
    # needle, NEEDLE_QUERIES queries = needle + NEEDLE_NOISE * N(0, I), scores scaled by 1/sqrt(d)), redrawn from
    # its generator and scored here in float64: the mean softmax mass on the needle
    g = private_generator("probe-needle", 64, 0)
    keys = torch.randn(NEEDLE_KEYS, 64, generator=g)
    needle = int(torch.randint(0, NEEDLE_KEYS, (1,), generator=g))
    q = keys[needle] + NEEDLE_NOISE * torch.randn(NEEDLE_QUERIES, 64, generator=g)
    fp32_mass = float(torch.softmax(q.double() @ keys.double().T / 8.0, -1)[:, needle].mean())
    assert 0.01 < fp32_mass < 0.99  # the needle neither drowns nor takes everything: the check below can tell
    # the probe's scores are float32 dot products of 64 terms (each off by <= gamma(64) sum |q_i k_i| / 8; 1/8 is
    # exact); a softmax mass moves by expm1(2 x that) at most (its score and the log-sum-exp each); its float64
    # softmax sums 4096 terms
    score_err = gamma(64) * float((q.abs().double() @ keys.abs().double().T).max()) / 8.0
    mass_rel = exp_rel(2 * score_err) + sum_rel(NEEDLE_KEYS, U64)
    assert {(r["codec"], r["bits"]) for r in table} == {(c, b) for c in codecs for b in (2, 3)}
    for r in table:
        assert r["unit_mse"] >= 4 ** -r["true_bits"]  # Shannon lower bound at the true rate
        assert r["true_bits"] >= r["bits"]  # side information is never free
        assert r["needle_mass_fp32"] == pytest.approx(fp32_mass, rel=mass_rel)
    # TurboQuant-MSE stores d_pad codes + a float32 norm: b + 32/64 bits per coordinate at d=64
    tq = {r["bits"]: r for r in table if r["codec"] == "turboquant-mse"}
    assert tq[2]["true_bits"] == pytest.approx(2 + 32 / 64)  # a float64 ratio of bit counts: default rel
    # the default split sits off the equal-rate line; every other row of a b keeps 3b bits/triplet
    for r in res["split_sweep"]:
        b_u, _, b_r = r["split"]
        assert 2 * b_u + b_r == 3 * r["bits"] + (1 if r["default"] else 0)
    for r in res["rounding_agreement"]:
        assert r["agreement"] >= 0.99
    text = (tmp_path / "report.md").read_text()
    assert "At matched true rate" in text and "octopus" in text


def test_probe_is_byte_identical(tmp_path):
    args = ["--dim", "64", "--bits", "2", "--n", "128", "--seeds", "1", "--codecs", "octopus", "turboquant-prod",
            "--no-sweep"]
    main(args + ["--out", str(tmp_path / "a")])
    main(args + ["--out", str(tmp_path / "b")])
    assert (tmp_path / "a/probe.json").read_bytes() == (tmp_path / "b/probe.json").read_bytes()
    assert json.loads((tmp_path / "a/probe.json").read_text())["config"]["dim"] == 64


def test_probe_rejects_unknown_codec(tmp_path):
    with pytest.raises(ValueError, match="Unknown codec 'zip'. Available:"):
        run(dim=64, bits=(2,), n=64, seeds=1, codecs=["zip"], out=None, progress=False)


def test_probe_skips_unsupported_bits():
    res = run(dim=64, bits=(1,), n=64, seeds=1, codecs=["turboquant-prod"], out=None, sweep=False, progress=False)
    assert res["table"] == [] and res["skipped"][0]["codec"] == "turboquant-prod"
