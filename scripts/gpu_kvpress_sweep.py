"""The long-context sweep of issue #24, timed end to end: ``harness run --task kvpress`` at 32k
context on random weights in Qwen2.5-7B's shape, every codec x bits x codec seeds.

    python -m scripts.gpu_kvpress_sweep                                   # 1 row, 32k, bits 2 3 4, seeds 0 1 2
    python -m scripts.gpu_kvpress_sweep --rows 2 --context 65536 --codecs octopus turboquant-mse
    python -m scripts.gpu_kvpress_sweep --tiny --device cpu --codecs kivi --bits 2 --codec-seeds 0   # checks it runs

Builds in ``--work`` (once; reused): a checkpoint of random weights (seed 0) with the in-process
byte tokenizer (one token per byte, so a context of N bytes is N tokens) and ``--rows`` synthetic
RULER-style rows in kvpress's layout: a haystack of the default corpus with one needle ("The special
magic number for <key> is <n>.") at a seeded depth, the question for it, the number as the answer.
Then it runs the sweep into a fresh run folder and prints the wall time and where it went: per
configuration the seconds of its rollouts (timings.jsonl), of which decoding (speed.jsonl), and
everything outside them (model load, the baselines with the one shared prefill, the report).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

import torch

from adapters.byte_tokenizer import byte_tokenizer
from harness.bench import QWEN25_7B, TINY, load_model
from harness.cli.main import main as harness
from harness.run.rows import read_rows
from harness.tasks.text_corpus import default_corpus
from kernels import list_codecs


def checkpoint(work: Path, shape: dict, device: str) -> Path:
    path = work / ("model-" + "-".join(str(shape[k]) for k in ("hidden_size", "num_hidden_layers")))
    if not (path / "config.json").is_file():
        model = load_model({**shape, "vocab_size": max(shape["vocab_size"], 257), "eos_token_id": 256,
                            "pad_token_id": 256, "bos_token_id": None}, device, torch.bfloat16)
        model.save_pretrained(path)
        byte_tokenizer().save_pretrained(path)
        del model
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return path


def rows(n: int, context: int, seed: int = 0) -> list[dict]:
    """``n`` niah rows of ``context`` bytes (= tokens for the byte tokenizer)."""
    rng = random.Random(seed)
    hay = " ".join(e.text for e in default_corpus())
    out = []
    for i in range(n):
        key, number = f"{rng.choice(['amber', 'cobalt', 'juniper', 'saffron'])}-{i}", rng.randrange(10 ** 6, 10 ** 7)
        needle = f" The special magic number for {key} is {number}. "
        body = (hay * (context // len(hay) + 1))[:context - len(needle) - 64]
        at = int(rng.uniform(0.1, 0.9) * len(body))
        out.append({"context": body[:at] + needle + body[at:], "task": "niah_single_1",
                    "question": f" What is the special magic number for {key} mentioned in the text?",
                    "answer_prefix": " The special magic number is", "answer": [str(number)], "max_new_tokens": 64})
    return out


def breakdown(out: Path, wall: float) -> list[str]:
    timings = read_rows(out / "timings.jsonl", keyed=False)
    speed = {(s["label"], s["codec_seed"], s["rollout"]): s for s in read_rows(out / "speed.jsonl", keyed=False)}
    configs = sum(t["seconds"] for t in timings)
    decode = sum(s["decode_s"] or 0.0 for s in speed.values())
    units = sum(s["decode_units"] for s in speed.values())
    return [f"wall {wall:.1f} s for {len(timings)} configuration rollouts ({len(read_rows(out / 'rows.jsonl'))} rows)",
            f"  rollouts of the configurations: {configs:.1f} s, of which decoding {decode:.1f} s "
            f"({units} tokens, {units / max(decode, 1e-9):.1f} tokens/s) and {configs - decode:.1f} s the rest "
            f"(replaying the shared prefill into the codec, the question chunk, the forced baseline answer)",
            f"  outside them: {wall - configs:.1f} s (model load, the baselines with the one shared prefill, report)"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvpress-sweep"))
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--codecs", nargs="+", default=[c for c in list_codecs() if c != "none"])
    ap.add_argument("--bits", nargs="+", default=["2", "3", "4"])
    ap.add_argument("--codec-seeds", nargs="+", default=["0", "1", "2"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--graphs", choices=("auto", "off"), default="auto",
                    help="harness run --graphs: decode steps from CUDA graphs where the cache allows, or eager")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and a 512-token context")
    a = ap.parse_args(argv)
    shape, context = (TINY, min(a.context, 512)) if a.tiny else (QWEN25_7B, a.context)
    a.work.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(a.work, shape, a.device)
    data = a.work / f"rows-{a.rows}-{context}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(a.rows, context)))
    out = a.work / "run"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    rc = harness(["run", "--model", "hf", "--model-path", str(ckpt), "--task", "kvpress", "--prompts", str(data),
                  "--codec", *a.codecs, "--bits", *a.bits, "--codec-seeds", *a.codec_seeds, "--device", a.device,
                  "--task-opt", f"kvpress.max_new_tokens={a.new_tokens}", "--graphs", a.graphs, "--out", str(out),
                  "--quiet"])
    wall = time.perf_counter() - t0
    if rc:
        return rc
    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else "CPU"
    print(f"kvpress sweep on {device}: {a.rows} row(s) of {context} tokens, codecs {' '.join(a.codecs)}, bits "
          f"{' '.join(a.bits)}, codec seeds {' '.join(a.codec_seeds)}, {a.new_tokens} answer tokens, graphs {a.graphs}")
    print("\n".join(breakdown(out, wall)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
