"""lm-eval model ``kvcodec`` and ``harness lm-eval``: offline (local JSON tasks, a tiny checkpoint)."""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

# lm_eval.api, not lm_eval: with tests/harness on sys.path this folder is a namespace package "lm_eval"
pytest.importorskip("lm_eval.api")

from adapters.cache.config import CacheConfig  # noqa: E402
from helpers.tiny_lm import save_tiny_checkpoint  # noqa: E402
from helpers.tolerances import gamma, log_close  # noqa: E402

TASKS = ("kv_mc", "kv_gen", "kv_roll")  # loglikelihood (multiple choice), generate_until, loglikelihood_rolling
TEXT = ("The quick brown fox jumps over the lazy dog while the cat sleeps by the warm stove. "
        "Tomorrow the weather will be cold and windy along the northern coast.")

TASK_YAML = {
    "kv_mc": """output_type: multiple_choice
target_delimiter: ""
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
""",
    "kv_gen": """output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{target}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
""",
    "kv_roll": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
""",
}


def _docs() -> dict[str, list[dict]]:
    words = TEXT.split()
    return {
        # the random model repeats the last character: "??" is its greedy answer (is_greedy True)
        "kv_mc": [{"question": f"{TEXT[:40 + 9 * i]} Question {i}: which word comes next?",
                   "choices": [" " + w for w in words[i:i + 2]] + ["??"], "answer": i % 3} for i in range(3)],
        "kv_gen": [{"prompt": TEXT[10 * i:70 + 13 * i], "target": " fox"} for i in range(3)],
        "kv_roll": [{"text": TEXT[20 * i:]} for i in range(2)],
    }


@pytest.fixture(scope="module", autouse=True)
def offline():
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.setenv("TOKENIZERS_PARALLELISM", "false")
    yield
    mp.undo()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory) -> Path:
    """One lm-eval task per request type over a local JSON Lines file (dataset_path: json)."""
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    for name, docs in _docs().items():
        (d / f"{name}.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs), encoding="utf-8")
        (d / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {d / name}.jsonl\n"
            f"test_split: test\n{TASK_YAML[name]}", encoding="utf-8")
    return d


def evaluate(model: str, model_args: str, tasks_dir: Path, batch_size: int = 1) -> dict:
    """lm-eval's simple_evaluate on the three local tasks; returns the results with samples."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    import harness.lm_eval.model  # noqa: F401  (registers 'kvcodec')

    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=list(TASKS), batch_size=batch_size,
                                   device="cpu", log_samples=True,
                                   task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False))


VOCAB = 257  # the byte tokenizer's: one token per byte


def ll_tol(n: int, ll: float) -> float:
    """How far float32 rounding may move a log-likelihood of an n-token continuation: each token's
    log-softmax sums VOCAB exponentials (gamma(VOCAB) absolute in its log), and `--model hf` sums the n
    terms in float32 (gamma(n) |ll|). The logits before them (two float32 forwards of one 2-layer model,
    chunked or whole, batched or not) have no clean bound; theirs is a few units of U32 on logits ~5
    (measured <= 5e-7 a token), far inside the gamma(VOCAB) = 1.5e-5 a token allowed here."""
    return n * gamma(VOCAB) + gamma(n) * abs(ll)


def n_tokens(task: str) -> list[list[int]]:
    """Per document of ``task`` (doc order), the tokens of each request's continuation."""
    docs = _docs()[task]
    if task == "kv_mc":
        return [[len(c.encode("utf-8")) for c in d["choices"]] for d in docs]
    return [[len(d["text"].encode("utf-8"))] for d in docs]


def assert_lls_close(got: dict, ref: dict) -> dict[str, list[list[float]]]:
    """Every log-likelihood of ``got`` within :func:`ll_tol` of ``ref``'s (responses()), the same is_greedy;
    returns each request's tolerance per task and document, for the metrics aggregated from them."""
    tols = {}
    for task in ("kv_mc", "kv_roll"):
        assert len(got[task]) == len(ref[task])
        tols[task] = []
        for g_doc, r_doc, n_doc in zip(got[task], ref[task], n_tokens(task), strict=True):
            tols[task].append([])
            for g, r, n in zip(g_doc, r_doc, n_doc, strict=True):
                g_ll, r_ll = (g[0], r[0]) if task == "kv_mc" else (g, r)
                tols[task][-1].append(ll_tol(n, r_ll))
                assert abs(g_ll - r_ll) <= tols[task][-1][-1], (task, g_ll, r_ll)
                if task == "kv_mc":
                    assert g[1] == r[1]
    return tols


def responses(results: dict) -> dict[str, list]:
    """Per task, each sample's raw responses in document order: [(loglikelihood, is_greedy), ...] per
    choice (multiple choice), [generation] (generate_until), [loglikelihood] (rolling)."""
    out = {}
    for task in TASKS:
        samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
        out[task] = [[r[0] for r in s["resps"]] for s in samples]
    return out


@pytest.fixture(scope="module")
def hf_results(ckpt, tasks_dir) -> dict:
    return evaluate("hf", f"pretrained={ckpt}", tasks_dir)


@pytest.fixture(scope="module")
def none_results(ckpt, tasks_dir) -> dict:
    return evaluate("kvcodec", f"pretrained={ckpt},codec=none,chunk=32", tasks_dir)


@pytest.fixture(scope="module")
def octopus_results(ckpt, tasks_dir) -> dict:
    return evaluate("kvcodec", f"pretrained={ckpt},codec=octopus,bits=2,residual=4,chunk=32", tasks_dir)


def test_evaluator_runs_its_tasks_over_one_index(ckpt, tasks_dir, none_results):
    """harness lm-eval-sweep's evaluate: the tasks asked for, as simple_evaluate gives them, samples logged."""
    from harness.lm_eval.command import evaluator

    evaluate = evaluator(str(tasks_dir), ["kv_mc"])
    got = evaluate("kvcodec", f"pretrained={ckpt},codec=none,chunk=32")
    assert list(got["results"]) == ["kv_mc"] and got["config"]["model_args"].endswith("chunk=32")
    by_doc = sorted(got["samples"]["kv_mc"], key=lambda s: s["doc_id"])
    assert [[r[0] for r in s["resps"]] for s in by_doc] == responses(none_results)["kv_mc"]


def test_a_batch_gives_every_request_its_own_answer(ckpt, tasks_dir, octopus_results):
    """batch_size=3: requests of different lengths run left-padded through one cache; every
    log-likelihood is the one of batch 1 to float32 rounding (ll_tol), is_greedy and generations are equal."""
    batched = evaluate("kvcodec", f"pretrained={ckpt},codec=octopus,bits=2,residual=4,chunk=32", tasks_dir,
                       batch_size=3)
    one, three = responses(octopus_results), responses(batched)
    assert three["kv_gen"] == one["kv_gen"]
    assert_lls_close(three, one)
    info, ref = batched["config"]["kvcodec"], octopus_results["config"]["kvcodec"]
    assert info["rollouts"] == ref["rollouts"]
    assert info["rollouts_with_committed_tokens"] == ref["rollouts_with_committed_tokens"]


def test_codec_none_equals_lm_eval_hf(hf_results, none_results):
    """codec=none through the cache gives what `--model hf` gives: log-likelihoods to float32
    rounding (chunked forwards vs one forward: ll_tol), the same is_greedy, the same generations; the
    task metrics within what those tolerances propagate to (perplexities compared in log space)."""
    ref, got = responses(hf_results), responses(none_results)
    tols = assert_lls_close(got, ref)
    assert any(g[1] for doc in got["kv_mc"] for g in doc) and not all(g[1] for doc in got["kv_mc"] for g in doc)
    assert got["kv_gen"] == ref["kv_gen"]
    assert len({g[0] for g in got["kv_gen"]}) == 3  # three different generations
    # acc: each document's best choice leads the next by more than both tolerances, so the argmax, and with it
    # acc (and its stderr, a function of acc), is the same number exactly
    for r_doc, tol in zip(ref["kv_mc"], tols["kv_mc"]):
        (best, i), (second, j) = sorted(((r[0], k) for k, r in enumerate(r_doc)), reverse=True)[:2]
        assert best - second > tol[i] + tol[j]
    assert {k: v for k, v in none_results["results"]["kv_mc"].items() if isinstance(v, float)} == {
        k: v for k, v in hf_results["results"]["kv_mc"].items() if isinstance(v, float)}
    # kv_roll: lm-eval's word_perplexity is exp(-sum ll / sum words), bits_per_byte -sum ll / (sum bytes ln 2)
    # (lm_eval.api.metrics, words as re.split(r"\s+")): the log-likelihoods' bound, summed, over those counts
    texts = [d["text"] for d in _docs()["kv_roll"]]
    err = sum(t[0] for t in tols["kv_roll"])
    words, nbytes = sum(len(re.split(r"\s+", t)) for t in texts), sum(len(t.encode("utf-8")) for t in texts)
    want, have = hf_results["results"]["kv_roll"], none_results["results"]["kv_roll"]
    assert {k for k, v in want.items() if isinstance(v, float)} == {"word_perplexity,none", "bits_per_byte,none"}
    assert log_close(have["word_perplexity,none"], want["word_perplexity,none"], err / words)
    assert abs(have["bits_per_byte,none"] - want["bits_per_byte,none"]) <= err / nbytes / math.log(2)


def test_compressing_codec_changes_loglikelihoods_a_little(none_results, octopus_results):
    base, comp = responses(none_results), responses(octopus_results)
    pairs = [(c[0], b[0]) for cd, bd in zip(comp["kv_mc"], base["kv_mc"]) for c, b in zip(cd, bd)]
    pairs += [(c, b) for cd, bd in zip(comp["kv_roll"], base["kv_roll"]) for c, b in zip(cd, bd)]
    diffs = [abs(c - b) for c, b in pairs]
    assert max(diffs) > 1e-2  # the continuations really read compressed keys (codec none: < 1e-4 measured)
    # and are close to the native scores: not rounding but the codec's effect (~0.1% measured), bounded at 1%
    assert all(d < 0.01 * abs(b) for d, (_, b) in zip(diffs, pairs))


def test_cache_statistics_in_results(none_results, octopus_results):
    info = octopus_results["config"]["kvcodec"]
    assert info["cache_config"]["codec"] == "octopus" and info["cache_config"]["bits"] == 2
    assert info["cache_config"]["residual"] == 4 and info["codec_config"]["bits"] == 2
    assert info["rollouts"] == {"loglikelihood": 9 + 2, "generate_until": 3}  # 3 docs x 3 choices, 2 windows
    assert info["rollouts_with_committed_tokens"] == 14
    mean = info["mean"]
    assert 2 <= mean["bits_per_coord"] < 4 and 2 <= mean["value_bits_per_coord"] < 4
    assert mean["cache_bytes"] < 0.5 * mean["uncompressed_bytes"]
    native = none_results["config"]["kvcodec"]["mean"]
    assert native["bits_per_coord"] == 32 and native["cache_bytes"] == native["uncompressed_bytes"]  # float32


def test_greedy_requests_take_greedy_and_equal_model_generate(ckpt):
    """A greedy generate_until request is decoded by CausalLM.greedy (its steps graphed on CUDA), one
    with other generation options by model.generate: the same answers up to the stop string."""
    from harness.lm_eval.model import KVCodecLM, _greedy

    assert _greedy({"attention_mask": 1, "do_sample": False}) and _greedy({"temperature": 0.0})
    assert not _greedy({"do_sample": True, "temperature": 0.7}) and not _greedy({"do_sample": False, "top_k": 1})
    lm = KVCodecLM(pretrained=str(ckpt), codec="octopus", bits=2, residual=4, device="cpu", batch_size=2)
    calls = []
    real = lm.lm.greedy
    lm.lm.greedy = lambda *a, **k: calls.append(a) or real(*a, **k)
    ctx = torch.tensor([[0, 0, 0, 72, 105, 32, 116, 104, 101, 114, 101], [84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98]])
    mask = (torch.arange(ctx.shape[1]) >= torch.tensor([[3], [0]])).long()
    texts = []
    for extra in ({}, {"top_k": 1}):  # top_k=1 without sampling is greedy too, but takes model.generate
        out = lm._model_generate(ctx, ctx.shape[1] + 12, ["e"], attention_mask=mask, do_sample=False, **extra)
        texts.append([lm.tokenizer.decode(row[ctx.shape[1]:].tolist(), skip_special_tokens=True).split("e")[0]
                      for row in out])
    assert len(calls) == 1 and texts[0] == texts[1] and all(texts[0]), texts
    # a generation config that adds a logits processor (a repetition penalty): model.generate, as before
    lm.model.generation_config.repetition_penalty = 1.05
    lm._model_generate(ctx, ctx.shape[1] + 4, ["e"], attention_mask=mask, do_sample=False)
    assert len(calls) == 1


def test_model_args_make_the_cache_config_the_cli_makes(ckpt):
    """model_args are read by the run's typed configuration: the same settings as `harness run` flags give
    the same CacheConfig (protect in either separator), and lm-eval's own option its declared value."""
    from lm_eval.utils import simple_parse_args_string

    from harness.cli.commands import parse_run
    from harness.lm_eval.args import check_args

    got = check_args(simple_parse_args_string(f"pretrained={ckpt},codec=octopus,bits=3,value_bits=4,residual=4,"
                                              "protect=0:-1,codec_seed=2,chunk=16"))
    cli = parse_run(["--codec", "octopus", "--bits", "3", "--value-bits", "4", "--residual", "4", "--protect", "0,-1",
                     "--codec-seeds", "2", "--no-baseline-row"]).config
    cli.validate()
    assert [got.cache] == cli.cache_configs() and got.cache.protect == [0, -1] and got.options.chunk == 16
    none = check_args({"pretrained": str(ckpt), "codec": None, "protect": None})  # lm-eval reads 'none' as None
    assert none.cache == CacheConfig(seed=0) and none.run.batch_size == 1 and none.options.chunk == 64


def test_bad_model_args_fail_before_any_request(ckpt):
    from harness.lm_eval.model import KVCodecLM

    with pytest.raises(ValueError, match="needs bits="):
        KVCodecLM(pretrained=str(ckpt), codec="octopus", device="cpu")
    with pytest.raises(ValueError, match="batch_size must be a positive number"):
        KVCodecLM(pretrained=str(ckpt), device="cpu", batch_size="auto")
    with pytest.raises(ValueError, match="bits"):
        KVCodecLM(pretrained=str(ckpt), codec="octopus", bits=9, device="cpu")


def test_harness_lm_eval_cli_writes_results_with_kvcodec_key(ckpt, tasks_dir, tmp_path, capsys, monkeypatch):
    import functools
    import logging

    import lm_eval.tasks
    import lm_eval.utils

    # lm-eval installs its log handler once, on the sys.stderr of that moment: capsys's here, closed after this
    # test, where later tests would log into it (a logging error on their stderr); its log goes nowhere instead
    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", True)
    monkeypatch.setattr(logging.getLogger("lm_eval"), "handlers", [logging.NullHandler()])

    from harness.cli.main import main

    # only the test's tasks are indexed (lm-eval's thousands of built-in tasks take ~10 s to index)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(lm_eval.tasks.TaskManager,
                                                                        include_defaults=False))
    out = tmp_path / "out"
    rc = main(["lm-eval", "--model", "kvcodec", "--model_args",
               f"pretrained={ckpt},codec=octopus,bits=3,residual=4", "--device", "cpu", "--tasks", "kv_mc",
               "--include_path", str(tasks_dir), "--output_path", str(out)])
    assert rc == 0
    files = list(out.rglob("results_*.json"))
    assert len(files) == 1
    results = json.loads(files[0].read_text())
    assert "kv_mc" in results["results"]
    assert "kvcodec" not in results["config"]
    kv = results["kvcodec"]
    assert kv["cache_config"]["codec"] == "octopus" and kv["rollouts"] == {"loglikelihood": 9}
    assert 3 <= kv["mean"]["bits_per_coord"] < 5
    assert "kvcodec" in capsys.readouterr().out  # lm-eval's table names the model


def test_an_evaluation_that_committed_nothing_is_refused(ckpt, tasks_dir, tmp_path, capsys, monkeypatch):
    """Issue 41: a window longer than every context (but within the model's positions) leaves every rollout
    native: one line and exit code 2 before lm-eval prints or saves a score; the statistics say why."""
    import functools
    import logging

    import lm_eval.tasks
    import lm_eval.utils

    from harness.cli.main import main

    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", True)  # as in the test above
    monkeypatch.setattr(logging.getLogger("lm_eval"), "handlers", [logging.NullHandler()])
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(lm_eval.tasks.TaskManager,
                                                                        include_defaults=False))
    monkeypatch.delenv("HARNESS_DEBUG", raising=False)
    out = tmp_path / "out"
    rc = main(["lm-eval", "--model", "kvcodec", "--model_args", f"pretrained={ckpt},codec=octopus,bits=3,residual=4000",
               "--device", "cpu", "--tasks", "kv_mc", "--include_path", str(tasks_dir), "--output_path", str(out)])
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]  # after the progress bars of the requests
    assert rc == 2 and last.startswith("harness lm-eval: error: ") and "Traceback" not in captured.err, captured.err
    assert "none of the 9 rollouts committed a token to the codec" in last and "residual=4000" in last
    assert not list(out.rglob("results_*.json")) and "kv_mc" not in captured.out


def test_harness_lm_eval_without_lm_eval_says_how_to_install(monkeypatch, capsys):
    from harness.cli.main import main

    for mod in ("harness.lm_eval.model", "harness.lm_eval.command"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["lm-eval", "--tasks", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["harness lm-eval: error: lm_eval is not installed: pip install '.[lm-eval]'"]


def test_a_chunked_prefill_gives_every_request_its_unchunked_answer(ckpt, tasks_dir, octopus_results):
    """``prefill_chunk=8``: every context (14-90 tokens) prefilled natively in pieces of 8, then replayed into
    the cache: the log-likelihoods of the one-piece prefill to float rounding, the same generations."""
    got = evaluate("kvcodec", f"pretrained={ckpt},codec=octopus,bits=2,residual=4,chunk=32,prefill_chunk=8", tasks_dir)
    assert got["config"]["kvcodec"]["prefill_chunk"] == 8
    assert octopus_results["config"]["kvcodec"]["prefill_chunk"] is None  # auto: short contexts in one piece
    assert_lls_close(responses(got), responses(octopus_results))
    assert responses(got)["kv_gen"] == responses(octopus_results)["kv_gen"]


def test_model_generate_prefills_in_chunks(ckpt):
    """A request model.generate decodes (top_k=1: greedy, but through generate) prefills as greedy ones do: no
    forward into the empty cache wider than the chunk, and the answers of the one-piece prefill."""
    from adapters.hf.compat import passed_cache
    from harness.lm_eval.model import KVCodecLM

    ctx = torch.tensor([[0, 0, 0, 72, 105, 32, 116, 104, 101, 114, 101], [84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98]])
    mask = (torch.arange(ctx.shape[1]) >= torch.tensor([[3], [0]])).long()
    outs, widest = {}, {}
    for chunk in ("auto", 4):
        lm = KVCodecLM(pretrained=str(ckpt), codec="octopus", bits=2, residual=4, device="cpu", batch_size=2,
                       prefill_chunk=chunk)
        forward = lm.model.forward

        def counted(*args, _chunk=chunk, **kw):
            cache, x = passed_cache(kw), kw.get("input_ids", args[0] if args else None)
            if cache is not None and cache.get_seq_length() == 0:
                widest[_chunk] = max(widest.get(_chunk, 0), x.shape[1])
            return forward(*args, **kw)

        lm.model.forward = counted
        outs[chunk] = lm._model_generate(ctx, ctx.shape[1] + 6, [], attention_mask=mask, do_sample=False, top_k=1)
    assert widest == {"auto": ctx.shape[1], 4: 4}
    assert torch.equal(outs[4], outs["auto"])
