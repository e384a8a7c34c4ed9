"""A codec's seed is what a run's codec seeds redraw: ``Codec.randomized`` must say whether it
changes anything, since a run repeats exactly the randomized codecs for every codec seed."""
import pytest
import torch

from kernels import CodecConfig, codec_class, list_codecs, make_codec


def _decoded(name: str, seed: int, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cls = codec_class(name)
    bits = next(b for b in cls.bits_supported if b >= 2) if any(b >= 2 for b in cls.bits_supported) else cls.bits_supported[0]
    codec = make_codec(CodecConfig(name, bits, keys.shape[-1], seed=seed, num_heads=keys.shape[1]))
    state = codec.encode(keys)
    q = torch.randn(keys.shape[0], keys.shape[1], 3, keys.shape[-1], generator=torch.Generator().manual_seed(7))
    return codec.decode(state), codec.score(q, state)


@pytest.mark.parametrize("name", sorted(list_codecs()))
def test_randomized_matches_what_the_seed_changes(name):
    d = 64 if codec_class(name).head_dim_unsupported(64) is None else 128  # mlx-g128 quantizes groups of 128
    keys = torch.randn(1, 2, 64, d,  # 64 tokens: whole KIVI groups
                       generator=torch.Generator().manual_seed(3))
    dec0, score0 = _decoded(name, 0, keys)
    dec1, score1 = _decoded(name, 1, keys)
    again, score_again = _decoded(name, 0, keys)
    assert torch.equal(dec0, again) and torch.equal(score0, score_again)  # the seed fixes every draw
    changed = not (torch.equal(dec0, dec1) and torch.equal(score0, score1))
    assert changed == codec_class(name).randomized, (
        f"{name}: the seed {'changes' if changed else 'does not change'} its output, "
        f"but it declares randomized={codec_class(name).randomized}")
