"""A synthetic run folder (config.json, model.json, rows.jsonl) with values drawn from a known
crossed model, for the summary, report and compare tests; no model runs. :func:`summary_of` and
:func:`rebuild` read it as ``harness report`` does (no registry.json: the loader builds it from the
registries, as for a run made before it)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from harness.run.config import RunConfig
from harness.run.rows import dumps

MODEL = {"name": "tiny", "source": "(synthetic)", "model_type": "llama", "layers": 2, "q_heads": 4, "kv_heads": 2,
         "head_dim": 16, "dtype": "float32", "device": "cpu"}
ENV = {"python": "3.11.7", "platform": "Linux", "packages": {"torch": "2.4.0", "numpy": "2.0.0"}, "cuda": None,
       "device": "cpu", "device_name": "cpu", "cpu": "cpu", "cpu_count": 2, "git": {"commit": "abc", "dirty": False}}
PROMPTS = ("p0", "p1", "p2", "p3")


def row(label: str, prompt: str, seed: int | None, kl: float, ppl: float, rate: float, **extra) -> dict:
    """One perplexity row; ``seed`` None leaves ``codec_seed`` out (a run folder from before seeds)."""
    codec, _, bits = label.partition("@")
    r = {"task": "perplexity", "prompt": prompt, "codec": codec, "bits": int(bits) if bits else 16, "label": label,
         "kl": kl, "perplexity": ppl, "top1_agree": 1.0 - kl, "bits_per_coord": rate, "cache_bits_per_coord": rate,
         "cache_bytes": 1000 * rate, "uncompressed_bytes": 16000, "tokens": 120, "scored_tokens": 60,
         "prompt_meta": {"source": f"/data/{prompt}.txt", "text_sha": f"sha-{prompt}"}}
    if seed is not None:
        r["codec_seed"] = seed
    r.update(extra)
    return r


def synthetic_rows(configs: dict[str, tuple[float, float, tuple[int, ...]]], prompts=PROMPTS, rng_seed: int = 0,
                   with_seed: bool = True) -> list[dict]:
    """Rows for the baseline and ``configs`` {label: (true mean kl, rate, codec seeds)}: kl = mean +
    prompt effect (shared by every config, sd 0.02) + seed effect (sd 0.002) + noise (sd 0.001): a
    gap of 0.01 between two configs is far outside what pairing leaves, 0.0001 well inside."""
    rng = np.random.default_rng(rng_seed)
    prompt_effect = dict(zip(prompts, rng.normal(0, 0.02, len(prompts))))
    rows = [row("none", p, 0 if with_seed else None, 0.0, 10.0, 16.0) for p in prompts]
    for label, (mean, rate, seeds) in configs.items():
        seed_effect = {s: rng.normal(0, 0.002) for s in seeds}
        for p in prompts:
            for s in seeds:
                kl = mean + prompt_effect[p] + seed_effect[s] + rng.normal(0, 0.001)
                rows.append(row(label, p, s if with_seed else None, kl, 10.0 + kl * 5, rate))
    return rows


def write_run(out: Path, rows: list[dict], model: dict | None = None, environment: dict | None = ENV) -> Path:
    """config.json (a real RunConfig), model.json (with ``environment`` unless None) and rows.jsonl."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    labels = {r["label"] for r in rows if r["label"] != "none"}
    config = RunConfig(model="hf", model_path="(synthetic)", tasks=["perplexity"],
                       codecs=sorted({lb.split("@")[0] for lb in labels}), bits=sorted({r["bits"] for r in rows
                                                                                       if r["label"] != "none"}))
    (out / "config.json").write_text(dumps(config.to_json(), indent=2) + "\n")
    model_json = {"model": model or MODEL, "skipped": []}
    if environment is not None:
        model_json["environment"] = environment
    (out / "model.json").write_text(json.dumps(model_json, indent=2))
    (out / "rows.jsonl").write_text("".join(dumps(r) + "\n" for r in rows))
    return out


def summary_of(out: Path) -> dict:
    """The summary of run folder ``out``, as ``harness report`` makes it (not read from summary.json)."""
    from harness.report.run_data import read_run
    from harness.report.summary import summarize_run

    return summarize_run(read_run(out))


def rebuild(out: Path) -> Path:
    """summary.json, report.md (returned) and report.html of run folder ``out``, as ``harness report`` writes them."""
    from harness.report.build import write_reports
    from harness.report.run_data import read_run

    return write_reports(read_run(out))


def run_bytes(out: Path, names) -> dict[str, bytes]:
    """{name: bytes} of run files ``names`` in ``out``; report.md and report.html without their speed
    sections, the one part of them measured (harness.report.speed) and so different between identical runs."""
    from harness.report.speed import without_speed

    out = Path(out)
    return {n: without_speed((out / n).read_text(encoding="utf-8")).encode() if n.startswith("report.")
            else (out / n).read_bytes() for n in names}


def shown(md: str) -> str:
    """Markdown text from report.md as a reader sees it: md_text's backslash escapes and entities undone."""
    import html
    import re

    return html.unescape(re.sub(r"\\(.)", r"\1", md))
