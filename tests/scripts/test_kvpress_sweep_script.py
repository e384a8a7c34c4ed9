"""scripts/gpu_kvpress_sweep.py (``python -m scripts.gpu_kvpress_sweep``) runs end to end on a tiny model on
the CPU (its figures come from a GPU)."""
from __future__ import annotations

import re

from helpers.tolerances import U64, gamma

from scripts import gpu_kvpress_sweep as sweep


def test_the_sweep_runs_tiny_on_the_cpu(tmp_path, capsys):
    rows = sweep.rows(2, 3000)
    assert [len(r["context"]) for r in rows] == [3000 - 64] * 2  # bytes: tokens of the byte tokenizer
    assert all(f"is {r['answer'][0]}." in r["context"] for r in rows)  # the needle is in its haystack
    assert sweep.main(["--tiny", "--device", "cpu", "--codecs", "kivi", "--bits", "2", "--codec-seeds", "0",
                       "--new-tokens", "4", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    wall, configs, decode, rest, outside = (float(x) for x in re.findall(
        r"wall ([\d.]+) s.*?configurations: ([\d.]+) s, of which decoding ([\d.]+) s.*?and ([\d.]+) s the rest.*?"
        r"outside them: ([\d.]+) s", out, re.S)[0])
    assert "2 configuration rollouts (2 rows)" in out  # none and kivi@2 on one prompt
    # decoding may be 0 s where the random model says EOS at once (its argmax differs from CPU to CPU)
    # the figures are printed to 0.1 s, each off by at most 0.05: a sum of three of them by 0.15, and the float64
    # subtractions here of figures below 2 wall add gamma(2) of that
    printed = 3 * 0.05 + gamma(2, U64) * 2 * wall
    assert 0 <= decode <= configs < wall and abs(configs - decode - rest) <= printed
    assert abs(wall - configs - outside) <= printed
