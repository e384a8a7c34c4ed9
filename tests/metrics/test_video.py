"""Video metrics against values computed by hand, and LPIPS's graceful absence."""
from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest
import torch
from helpers.tolerances import U64, gamma

from metrics import get_metric
from metrics import video as vm


def _frames(seed=0, T=3, H=40, W=56):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(T, 3, H, W, generator=g) * 2 - 1


def test_registered_with_direction():
    assert get_metric("psnr").higher_is_better and get_metric("ssim").higher_is_better
    assert get_metric("latent_cos").higher_is_better and not get_metric("lpips").higher_is_better
    assert all("video" in get_metric(m).modalities for m in ("psnr", "ssim", "lpips", "latent_cos"))


def test_psnr_by_hand():
    ref = torch.zeros(2, 3, 8, 8)
    pred = ref.clone()
    pred[0] += 0.125  # MSE 1/64 -> 10 log10(4 * 64)
    pred[1, 0, 0, 0] = 1.0  # one pixel off by 1: MSE 1 / 192
    p = vm.psnr_frames(pred, ref)
    # float64: a mean of n squares (gamma(n + 1) relative), the division and 10 log10 (10 / ln 10 per unit of
    # relative error, and its own rounding of a value below 40)
    def tol(n):
        return 10 / math.log(10) * gamma(n + 3, U64) + 40 * U64
    assert p[0].item() == pytest.approx(10 * math.log10(256), abs=tol(192))
    assert p[1].item() == pytest.approx(10 * math.log10(4 * 192), abs=tol(192))
    assert vm.psnr_video(pred, ref) == pytest.approx(10 * math.log10(4 / ((192 / 64 + 1) / 384)), abs=tol(384))
    assert torch.isinf(vm.psnr_frames(ref, ref)).all() and math.isinf(vm.psnr_video(ref, ref))


def test_ssim_by_hand_and_against_skimage():
    from skimage.metrics import structural_similarity
    a, b = torch.full((1, 3, 32, 32), 0.25), torch.full((1, 3, 32, 32), -0.5)
    c1 = (0.01 * 2) ** 2  # constant frames: SSIM = (2 mu_x mu_y + C1) / (mu_x^2 + mu_y^2 + C1)
    # float32 (torchmetrics on a CPU): the 11 x 11 window's weights sum to S = 1 within gamma(121), so a constant
    # frame's local variances and covariance come out c_x c_y S (1 - S) rather than 0 (c powers of two: the other
    # products are exact), moving the structure term (2 s_xy + C2) / (s_x^2 + s_y^2 + C2) by at most
    # (2 |c_x c_y| + c_x^2 + c_y^2) gamma(121) / C2; the formula's own roundings add a few U32
    c2 = (0.03 * 2) ** 2
    tol = (2 * 0.125 + 0.0625 + 0.25) * gamma(121) / c2 + gamma(12)
    assert vm.ssim_frames(a, b).item() == pytest.approx((2 * 0.25 * -0.5 + c1) / (0.0625 + 0.25 + c1), abs=tol)
    x = _frames(1)
    assert torch.equal(vm.ssim_frames(x, x), torch.ones(3, dtype=torch.float64))
    g = torch.Generator().manual_seed(2)
    ref = torch.nn.functional.interpolate(torch.rand(1, 3, 16, 20, generator=g), size=(128, 160), mode="bilinear") * 2 - 1
    pred = (ref + 0.1 * torch.randn(ref.shape, generator=g)).clamp(-1, 1)
    ours = vm.ssim_frames(pred, ref)
    theirs = [structural_similarity(p.double().numpy(), r.double().numpy(), data_range=2.0, channel_axis=0,
                                    gaussian_weights=True, sigma=1.5, use_sample_covariance=False)
              for p, r in zip(pred, ref)]
    # they differ only in border handling: windows within 5 pixels (the window's radius) of an edge, 13.6% of a
    # 128 x 160 frame; on these smooth frames those windows' SSIMs differ by under 0.07, so the means by 1e-2
    # (elsewhere float32 against float64: ~1e-6)
    assert np.allclose(ours.numpy(), theirs, atol=1e-2)


def test_latent_cosine_by_hand():
    ref = torch.zeros(1, 2, 3, 1, 2)  # [B, C, F, h, w]: each frame is a 4-vector
    pred = torch.zeros_like(ref)
    ref[0, :, 0, 0] = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    pred[0, :, 0, 0] = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # 45 degrees
    ref[0, :, 1, 0] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    pred[0, :, 1, 0] = -ref[0, :, 1, 0]
    ref[0, :, 2, 0] = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    pred[0, :, 2, 0] = 3 * ref[0, :, 2, 0]
    c = vm.latent_cosine_frames(pred, ref)
    # float64 (exact widening): a 4-term dot, two 4-term norms, their product and the division
    assert c.tolist() == pytest.approx([1 / math.sqrt(2), -1.0, 1.0], abs=gamma(4 * 3 + 4, U64))


def test_summarize():
    s = vm.summarize(torch.tensor([1.0, 2.0, 6.0]))
    assert s == {"mean": 3.0, "min": 1.0, "max": 6.0}


def test_lpips_unavailable_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    vm._lpips_model.cache_clear()
    ok, why = vm.lpips_status()
    assert not ok and "alexnet-owt-7be5be79.pth" in why and "nothing is downloaded" in why
    with pytest.raises(vm.MetricUnavailable, match="LPIPS unavailable"):
        vm.lpips_frames(_frames(), _frames(1), device="cpu")
    vm._lpips_model.cache_clear()


@pytest.fixture
def fake_alexnet(tmp_path, monkeypatch):
    """Random AlexNet weights in torchvision's layout, in a private torch hub cache."""
    trunk = vm._AlexTrunk()
    g = torch.Generator().manual_seed(0)
    sd = {k: torch.randn(v.shape, generator=g) * (0.05 if k.endswith("weight") else 0.01)
          for k, v in trunk.state_dict().items()}
    sd["classifier.1.weight"] = torch.zeros(4, 4)  # torchvision's file has the classifier too
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(sd, tmp_path / "hub" / "checkpoints" / vm.ALEXNET_FILE)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    vm._lpips_model.cache_clear()
    yield sd
    vm._lpips_model.cache_clear()


def test_lpips_local_matches_lpips_package(fake_alexnet, monkeypatch):
    ok, _ = vm.lpips_status()
    assert ok
    monkeypatch.setitem(sys.modules, "torchvision", None)  # the local path, where torchvision is installed too
    x, y = _frames(0, H=64, W=64), _frames(1, H=64, W=64)
    d = vm.lpips_frames(x, y, device="cpu")
    assert d.shape == (3,) and (d > 0).all()
    assert torch.equal(vm.lpips_frames(x, x, device="cpu"), torch.zeros(3, dtype=torch.float64))
    # the lpips package itself, with a stand-in torchvision that serves the same cached AlexNet
    tv = types.ModuleType("torchvision")
    tv.models = types.SimpleNamespace(alexnet=lambda pretrained=True, **kw: _tv_alexnet(fake_alexnet))
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    for name in [m for m in sys.modules if m == "lpips" or m.startswith("lpips.")]:
        monkeypatch.delitem(sys.modules, name)
    import lpips
    ref = lpips.LPIPS(net="alex", version="0.1", verbose=False).eval()
    with torch.no_grad():
        expected = ref(x, y).flatten().double()
    # the same AlexNet in float32, its features normalised, differenced and averaged per layer by two
    # implementations in other orders: float32 rounding (U32 of the terms each) of LPIPS's sums, ~100 U32 of d
    torch.testing.assert_close(d, expected, rtol=1e-5, atol=1e-7)
    for name in [m for m in sys.modules if m == "lpips" or m.startswith("lpips.")]:
        del sys.modules[name]


def _tv_alexnet(sd):
    trunk = vm._AlexTrunk()
    trunk.load_state_dict({k: v for k, v in sd.items() if k.startswith("features.")})
    return trunk
