"""Audio metrics against values computed by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from metrics import get_metric
from metrics import audio as am


@pytest.fixture(scope="module")
def noise():
    g = torch.Generator().manual_seed(0)
    return (0.3 * torch.randn(24_000, generator=g, dtype=torch.float64)).numpy()


def test_snr_by_hand():
    ref = np.array([1.0, 2.0, 3.0, 4.0])
    x = ref + np.array([0.1, -0.1, 0.1, -0.1])
    assert am.snr_db(ref, x) == pytest.approx(10 * math.log10(30 / 0.04), rel=1e-12)
    assert am.snr_db(ref, ref) == math.inf
    assert am.snr_db(ref, -ref) == pytest.approx(10 * math.log10(30 / 120), rel=1e-12)  # negative: worse than silence


@pytest.mark.parametrize("a", [0.5, 2.0, 0.1])
def test_lsd_of_a_gain_is_the_gain_in_db(noise, a):
    # P_x = a^2 P_ref in every bin, so every frame's distance is |10 log10 a^2| (the 1e-10 floor is negligible)
    assert am.lsd(noise, a * noise) == pytest.approx(abs(20 * math.log10(a)), rel=1e-6)
    assert am.lsd(noise, noise) == 0.0


def test_lsd_by_hand_on_one_frame():
    # 5 samples, n_fft 8: reflect padding by 4 gives one frame [0, 0, 0, 0, c, 0, 0, 0], an impulse at the
    # Hann window's peak (weight 1), so |FFT|^2 = c^2 in every bin
    np.testing.assert_allclose(am._power_spec(np.array([2.0, 0, 0, 0, 0]), 8, 100), np.full((1, 5), 4.0), atol=1e-12)
    # then every bin differs by 10 log10(4 / 1) dB
    assert am.lsd([1.0, 0, 0, 0, 0], [2.0, 0, 0, 0, 0], n_fft=8, hop=100) == pytest.approx(10 * math.log10(4), rel=1e-9)


@pytest.mark.parametrize("a", [0.5, 3.0])
def test_log_mel_mse_of_a_gain(noise, a):
    # ln(a^2 M) - ln(M) = 2 ln a in every band (white noise keeps every band far above the 1e-5 floor)
    assert am.log_mel_mse(noise, a * noise, sr=24_000) == pytest.approx((2 * math.log(a)) ** 2, rel=1e-4)
    assert am.log_mel_mse(noise, noise) == 0.0


def test_latent_cosine_by_hand():
    assert am.latent_cosine(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])) == pytest.approx(1 / math.sqrt(2))
    assert am.latent_cosine([1.0, 2.0], [-2.0, -4.0]) == pytest.approx(-1.0)


def test_token_agreement_and_match_by_hand():
    ref = torch.tensor([[[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]], [[0.0, 0.0, 5.0], [0.0, 1.0, 0.5]]])
    x = torch.tensor([[[0.0, 1.0, 0.5], [0.0, 0.0, 2.0]], [[0.0, 0.0, 5.0], [3.0, 1.0, 0.5]]])
    assert am.token_agreement(ref, x) == 0.5  # positions 0 and 2 agree
    assert am.pooled(am.token_agreement, [ref[:, :1], ref[:, 1:]], [x[:, :1], x[:, 1:]]) == 0.5
    assert am.per_scale(am.token_agreement, [ref[:, :1], ref[:, 1:]], [x[:, :1], x[:, 1:]]) == [1.0, 0.0]
    assert am.token_match([torch.tensor([[1, 2]]), torch.tensor([[3, 4, 5]])],
                          [torch.tensor([[1, 0]]), torch.tensor([[3, 4, 0]])]) == pytest.approx(3 / 5)


def test_kl_by_hand():
    ref = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)  # p = (1/4, 3/4)
    x = torch.tensor([[0.0, 0.0]], dtype=torch.float64)  # q = (1/2, 1/2)
    assert am.kl_divergence(ref, x) == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), rel=1e-12)
    assert am.kl_divergence(ref, ref) == 0.0
    # mean over positions
    two = am.kl_divergence(torch.cat([ref, ref]), torch.cat([x, ref]))
    assert two == pytest.approx(0.5 * (0.25 * math.log(0.5) + 0.75 * math.log(1.5)))


def test_registered_with_directions():
    want = {"snr_db": True, "lsd": False, "log_mel_mse": False, "latent_cos": True,
            "top1_agree": True, "kl": False, "free_token_match": True}
    for name, higher in want.items():
        m = get_metric(name)
        assert "audio" in m.modalities and m.higher_is_better is higher
