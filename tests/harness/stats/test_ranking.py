"""harness/stats/ranking.py: ranks that show ties (1, 1, 3) and the rate-matched front."""
from __future__ import annotations

import numpy as np

from harness.stats.ranking import Comparisons, Config, front, rank

PROMPTS, SEEDS = 8, 3


def kl_cells(mean: float, rng, seeds=SEEDS, shared=None) -> dict:
    """{(prompt, seed): kl}: ``mean`` + a prompt effect shared by every config (sd 0.05) + noise (sd 0.001)."""
    return {(f"p{p}", s): mean + shared[p] + rng.normal(0, 0.001) for p in range(PROMPTS) for s in range(seeds)}


def configs(spec: dict[str, tuple[int, float, float]], seed: int = 0) -> list[Config]:
    """spec {label: (bits, true mean kl, rate)} -> Configs with cells."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, 0.05, PROMPTS)
    return [Config(label, bits, kl_cells(mean, rng, shared=shared), rate) for label, (bits, mean, rate) in spec.items()]


def test_ties_share_a_rank():
    cs = configs({"c@2": (2, 0.30, 2.0), "a@2": (2, 0.10, 2.0), "b@2": (2, 0.10, 2.1)})
    out = rank(cs, Comparisons(cs, higher_is_better=False))
    assert [(c["label"], c["rank"]) for c in out["configs"]][2] == ("c@2", 3)  # worst mean last
    assert {c["label"]: c["rank"] for c in out["configs"]} == {"a@2": 1, "b@2": 1, "c@2": 3}
    words = {(p["a"], p["b"]): p["word"] for p in out["pairs"]}
    assert len(words) == 3 and set(words.values()) == {"indistinguishable", "better"}
    assert [w for (a, b), w in words.items() if {a, b} == {"a@2", "b@2"}] == ["indistinguishable"]
    # the other direction: higher is better turns the ranking round
    out = rank(cs, Comparisons(cs, higher_is_better=True))
    assert {c["label"]: c["rank"] for c in out["configs"]} == {"a@2": 2, "b@2": 2, "c@2": 1}
    # no direction: no ranks, the comparisons say higher / lower
    out = rank(cs, Comparisons(cs, higher_is_better=None))
    assert all(c["rank"] is None for c in out["configs"]) and "higher" in {p["word"] for p in out["pairs"]}


def test_front_keeps_what_nothing_cheaper_beats():
    cs = configs({"cheap@2": (2, 0.30, 2.0),     # cheapest: on the front however bad
                  "good@2": (2, 0.10, 2.5),      # better than everything cheaper
                  "dear@3": (3, 0.20, 3.0),      # good@2 stores less and is better: off
                  "same@3": (3, 0.10, 3.5),      # as good as good@2, not better: on
                  "twin@3": (3, 0.25, 3.0)})     # same rate as dear@3, worse than it: off
    out = {f["label"]: f for f in front(cs, Comparisons(cs, higher_is_better=False))}
    assert [f["label"] for f in front(cs, Comparisons(cs, False))] == ["cheap@2", "good@2", "dear@3", "twin@3", "same@3"]
    assert {k: f["front"] for k, f in out.items()} == {"cheap@2": True, "good@2": True, "dear@3": False,
                                                       "same@3": True, "twin@3": False}
    assert out["dear@3"]["dominated_by"] == ["good@2"]
    assert out["twin@3"]["dominated_by"] == ["good@2", "dear@3"]  # cheapest first; dear@3 at an equal rate counts
    assert out["cheap@2"]["cache_bits_per_coord"] == 2.0 and out["dear@3"]["bits"] == 3
    unknown = [Config("x@2", 2, cs[0].cells, None), *cs[1:]]
    assert front(unknown, Comparisons(unknown, False))[-1] == {"label": "x@2", "bits": 2, "cache_bits_per_coord": None,
                                                                "front": None, "dominated_by": []}
