"""Audio metrics against values computed by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helpers.tolerances import U32, U64, gamma

from metrics import get_metric
from metrics import audio as am

DB = 10 / math.log(10)  # dB per unit of a natural log: 10 log10 moves by DB times a relative error


@pytest.fixture(scope="module")
def noise():
    g = torch.Generator().manual_seed(0)
    return (0.3 * torch.randn(24_000, generator=g, dtype=torch.float64)).numpy()


def test_snr_by_hand():
    ref = np.array([1.0, 2.0, 3.0, 4.0])
    x = ref + np.array([0.1, -0.1, 0.1, -0.1])
    # float64: two 4-term sums of squares (their differences and squares too) and a division, within gamma(12)
    # relative, through 10 log10 (and its own rounding, each side)
    tol = DB * gamma(12, U64) + 2 * U64 * 30
    assert am.snr_db(ref, x) == pytest.approx(10 * math.log10(30 / 0.04), abs=tol)
    assert am.snr_db(ref, ref) == math.inf
    assert am.snr_db(ref, -ref) == pytest.approx(10 * math.log10(30 / 120), abs=tol)  # negative: worse than silence


@pytest.mark.parametrize("a", [0.5, 2.0, 0.1])
def test_lsd_of_a_gain_is_the_gain_in_db(noise, a):
    # P_x = a^2 P_ref in every bin, so every frame's distance is |10 log10 a^2|, up to the 1e-10 floor (a bin
    # moves by floor / P |1 - a^-2| relative) and float64's FFT (||dX|| <= gamma(2 log2 n) ||X|| a frame, so a
    # bin's power by 2 gamma(22) sqrt(sum P / P) relative, each side); a frame's RMS over bins moves by at most the
    # RMS of its bins' moves (Minkowski), the mean over frames by their mean
    P = am._power_spec(noise, 2048, 512)
    rel = am.POWER_FLOOR / P * abs(1 - a ** -2) + 4 * gamma(22, U64) * np.sqrt(P.sum(-1, keepdims=True) / P)
    tol = DB * float(np.sqrt((rel ** 2).mean(-1)).mean())
    assert am.lsd(noise, a * noise) == pytest.approx(abs(20 * math.log10(a)), abs=tol)
    assert am.lsd(noise, noise) == 0.0


def test_lsd_by_hand_on_one_frame():
    # 5 samples, n_fft 8: reflect padding by 4 gives one frame [0, 0, 0, 0, c, 0, 0, 0], an impulse at the
    # Hann window's peak (weight 1), so |FFT|^2 = c^2 in every bin
    # (float64: an 8-point FFT of one non-zero sample, log2 8 butterfly stages of rounding relative to |c|, squared)
    np.testing.assert_allclose(am._power_spec(np.array([2.0, 0, 0, 0, 0]), 8, 100), np.full((1, 5), 4.0), rtol=0,
                               atol=4.0 * 2 * gamma(3 + 2, U64))
    # then every bin differs by 10 log10(4 / 1) dB: each power within 2 gamma(5) relative, the floor's 1e-10 of 1
    assert am.lsd([1.0, 0, 0, 0, 0], [2.0, 0, 0, 0, 0], n_fft=8, hop=100) == pytest.approx(
        10 * math.log10(4), abs=DB * (4 * gamma(5, U64) + am.POWER_FLOOR))


@pytest.mark.parametrize("a", [0.5, 3.0])
def test_log_mel_mse_of_a_gain(noise, a):
    # ln(a^2 M) - ln(M) = 2 ln a in every band (white noise keeps every band far above the 1e-5 floor), up to
    # librosa's float32: a band is a sum of ~n_fft / 2 nonnegative bin powers, each from a float32 FFT, within
    # e = gamma(512 + 2 log2 1024) of its value to first order; each log-ratio within 2 e of 2 ln a, and the
    # mean of their squares within 2 |2 ln a| (2 e) + (2 e)^2 of (2 ln a)^2
    e = gamma(512 + 20, U32)
    want = (2 * math.log(a)) ** 2
    assert am.log_mel_mse(noise, a * noise, sr=24_000) == pytest.approx(want, abs=4 * abs(math.log(a)) * 2 * e + 4 * e * e)
    assert am.log_mel_mse(noise, noise) == 0.0


def test_latent_cosine_by_hand():
    # float64 (the inputs widen exactly): a 2-term dot, two 2-term norms, their product and the division
    tol = gamma(2 * 2 + 4, U64)
    assert am.latent_cosine(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])) == pytest.approx(1 / math.sqrt(2), rel=tol)
    assert am.latent_cosine([1.0, 2.0], [-2.0, -4.0]) == pytest.approx(-1.0, rel=tol)


def test_token_agreement_and_match_by_hand():
    ref = torch.tensor([[[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]], [[0.0, 0.0, 5.0], [0.0, 1.0, 0.5]]])
    x = torch.tensor([[[0.0, 1.0, 0.5], [0.0, 0.0, 2.0]], [[0.0, 0.0, 5.0], [3.0, 1.0, 0.5]]])
    assert am.token_agreement(ref, x) == 0.5  # positions 0 and 2 agree
    assert am.pooled(am.token_agreement, [ref[:, :1], ref[:, 1:]], [x[:, :1], x[:, 1:]]) == 0.5
    assert am.per_scale(am.token_agreement, [ref[:, :1], ref[:, 1:]], [x[:, :1], x[:, 1:]]) == [1.0, 0.0]
    assert am.token_match([torch.tensor([[1, 2]]), torch.tensor([[3, 4, 5]])],
                          [torch.tensor([[1, 0]]), torch.tensor([[3, 4, 0]])]) == 3 / 5  # a count over a count


def test_kl_by_hand():
    ref = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)  # p = (1/4, 3/4)
    x = torch.tensor([[0.0, 0.0]], dtype=torch.float64)  # q = (1/2, 1/2)
    # float64 log-softmaxes of 2 logits (a log-sum-exp over values up to log 3, a few U64 each) and a 2-term sum
    # against the closed form's own few roundings: in absolute terms, at most gamma(8) of (log 3 + 1) per term
    tol = gamma(8, U64) * (math.log(3.0) + 1)
    assert am.kl_divergence(ref, x) == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=tol)
    assert am.kl_divergence(ref, ref) == 0.0
    # mean over positions
    two = am.kl_divergence(torch.cat([ref, ref]), torch.cat([x, ref]))
    assert two == pytest.approx(0.5 * (0.25 * math.log(0.5) + 0.75 * math.log(1.5)), abs=tol)


def test_registered_with_directions():
    want = {"snr_db": True, "lsd": False, "log_mel_mse": False, "latent_cos": True,
            "top1_agree": True, "kl": False, "free_token_match": True}
    for name, higher in want.items():
        m = get_metric(name)
        assert "audio" in m.modalities and m.higher_is_better is higher
