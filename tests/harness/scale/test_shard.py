"""harness/scale/shard.py + harness/scale/merge.py on the tiny text model, in process: N shards of one run
merge to the single process's bytes; a stopped shard is named and resumes; shards of another
count, a single-process resume and the locks between them; where a shard comes from."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time

import pytest
from helpers.run_folder import run_bytes
from helpers.tiny_lm import tiny_causal_lm

from harness.run.config import RunConfig, RunError
from harness.run.lock import STALE_S, RunLock, RunLocked
from harness.run.folder import RunFolder
from harness.report.build import report
from harness.run.rows import read_rows, row_key
from harness.runner import run
from harness.run.plan import Plan, read_plan
from harness.scale.shard import Shard, pin_local_gpu, shard_files

TEXT = ("The quick brown fox jumps over the lazy dog. A stitch in time saves nine. " * 60).strip()
# perplexity batch 2: three prompts make batches [p0, p1] and [p2] (a batch never straddles shards)
OPTS = {"perplexity": {"context": 120, "prefix": 60, "chunk": 20, "batch": 2},
        "needle": {"contexts": [400], "depths": [0.2, 0.5, 0.8], "needles": 1, "max_new_tokens": 2}}
FILES = ("rows.jsonl", "summary.json", "report.md", "report.html")
QUIET = dict(progress=False, log=lambda *_: None)


@pytest.fixture(scope="module")
def lm():
    return tiny_causal_lm("qwen2")


@pytest.fixture(scope="module")
def textfile(tmp_path_factory):
    f = tmp_path_factory.mktemp("text") / "fox.txt"
    f.write_text(TEXT)
    return f


def _config(textfile, **kw) -> RunConfig:
    c = {**dict(model="hf", model_path="(tiny)", tasks=["perplexity", "needle"], codecs=["octopus"], bits=[2],
                prompts=str(textfile), limit=3, residual=8, codec_seeds=[0]), **kw}
    return RunConfig(**c, task_options={t: o for t, o in OPTS.items() if t in c["tasks"]})


def _bytes(out):
    return run_bytes(out, FILES)


@pytest.fixture(scope="module")
def single(lm, textfile, tmp_path_factory):
    """The run in one process: the reference every sharded run must reproduce byte for byte."""
    return run(_config(textfile), out=tmp_path_factory.mktemp("single") / "run", model=lm, **QUIET)


def _count_baselines(monkeypatch):
    """Prompt ids of every baseline rollout computed (not read back), in call order."""
    from harness.tasks import get_task

    calls = []
    for cls in {get_task("perplexity"), get_task("needle")}:
        orig = cls.baseline_batch

        def counted(self, model, prompts, seed, _orig=orig):
            calls.extend(p.id for p in prompts)
            return _orig(self, model, prompts, seed)
        monkeypatch.setattr(cls, "baseline_batch", counted)
    return calls


@pytest.mark.parametrize("count", [1, 2, 3])
def test_shards_merge_to_the_single_process_bytes(lm, textfile, single, tmp_path, monkeypatch, count):
    out = tmp_path / "run"
    baselines = _count_baselines(monkeypatch)
    made = {}
    for i in range(count):
        run(_config(textfile), out=out, model=lm, shard=Shard(i, count), on_row=made.setdefault(i, []).append,
            **QUIET)
        if i < count - 1:  # not merged until the last shard ends
            assert not (out / "rows.jsonl").exists() and Shard(i, count).rows_name in {
                p.name for p in shard_files(out).values()}
    assert _bytes(out) == _bytes(single)
    # the shard count is not part of the run: same config.json (so the same hash), no file or lock left
    assert (out / "config.json").read_bytes() == (single / "config.json").read_bytes()
    assert not shard_files(out) and not list(out.glob(f"{RunFolder.LOCK}*"))
    # every row computed once, by the shard the plan gives its batch; every baseline once
    plan = read_plan(out)
    keys = [row_key(r) for rows in made.values() for r in rows]
    assert sorted(keys) == sorted(plan.keys()) and len(set(keys)) == len(keys)
    for i, rows in made.items():
        assert [row_key(r) for r in rows] == plan.shard_keys(Shard(i, count))
    assert sorted(baselines) == sorted(p for _, batches in plan.tasks for b in batches for p in b)
    assert (out / f"timings.shard-0-of-{count}.jsonl").exists() if count > 1 else (out / "timings.jsonl").exists()
    # each row's speed line, merged like the rows: one per key, in plan order, the shard files gone
    assert [row_key(s) for s in read_rows(out / "speed.jsonl")] == plan.keys() and not shard_files(out, "speed")


def test_plan_assigns_whole_batches_by_hash_evenly():
    plan = Plan([("ppl", [["a", "b"], ["c"]]), ("needle", [[f"n{i}"] for i in range(7)])], [("none", 0), ("x@2", 1)])
    assert plan.keys()[:4] == [("ppl", "a", "none", 0), ("ppl", "b", "none", 0), ("ppl", "a", "x@2", 1),
                               ("ppl", "b", "x@2", 1)]  # task, batch, configuration, prompt
    for count in (1, 2, 3, 4):
        owners = plan.owners(count)
        # reference: per task, batches sorted by sha256 of "task\0first id", dealt from where the last task ended
        start = 0
        for (task, batches), owner in zip(plan.tasks, owners):
            ranked = sorted(range(len(batches)),
                            key=lambda b: hashlib.sha256(f"{task}\0{batches[b][0]}".encode()).hexdigest())
            assert [owner[b] for b in ranked] == [(start + r) % count for r in range(len(batches))]
            start += len(batches)
            sizes = [owner.count(i) for i in range(count)]
            assert max(sizes) - min(sizes) <= 1
        shards = [set(plan.shard_keys(Shard(i, count))) for i in range(count)]
        assert set().union(*shards) == set(plan.keys()) and sum(map(len, shards)) == len(plan.keys())
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_a_stopped_shard_is_named_and_resumes(lm, textfile, single, tmp_path):
    out = tmp_path / "run"

    class Stop(Exception):
        pass

    def stop_after(n):
        seen = []

        def on_row(row):
            seen.append(row)
            if len(seen) == n:
                raise Stop
        return on_row

    run(_config(textfile), out=out, model=lm, shard=Shard(0, 3), **QUIET)
    with pytest.raises(Stop):
        run(_config(textfile), out=out, model=lm, shard=Shard(1, 3), on_row=stop_after(2), **QUIET)
    with open(out / Shard(1, 3).rows_name, "a") as f:
        f.write('{"task": "needle", "prom')  # a crash mid-write
    assert not (out / Shard(1, 3).lock_name).exists()  # released on the exception
    plan = read_plan(out)
    assert report(out) is False  # harness report RUN: the rows so far, and what is missing
    md = (out / "report.md").read_text()
    n1, n2 = len(plan.shard_keys(Shard(1, 3))), len(plan.shard_keys(Shard(2, 3)))
    n0 = len(plan.keys()) - n1 - n2
    assert (f"**Incomplete**: {n0 + 2} of {len(plan.keys())} planned rows are stored; shard 1 of 3 has 2 of {n1} rows "
            f"(stopped); shard 2 of 3 has 0 of {n2} rows (not started)") in md
    merged = read_rows(out / "rows.jsonl")
    assert len(merged) == n0 + 2 and shard_files(out)  # merged so far in plan order; shard files kept
    order = {k: i for i, k in enumerate(plan.keys())}
    assert [order[row_key(r)] for r in merged] == sorted(order[row_key(r)] for r in merged)
    for i in (2, 1):  # the missing shard, then the stopped one (its torn line repaired), in either order
        run(_config(textfile), out=out, model=lm, shard=Shard(i, 3), **QUIET)
    assert _bytes(out) == _bytes(single) and not shard_files(out)


def test_another_shard_count_and_a_single_process_resume_the_run(lm, textfile, single, tmp_path):
    out = tmp_path / "run"
    run(_config(textfile), out=out, model=lm, shard=Shard(1, 2), **QUIET)
    made = []
    run(_config(textfile), out=out, model=lm, shard=Shard(0, 3), on_row=made.append, **QUIET)
    before = set(map(row_key, read_rows(out / Shard(1, 2).rows_name)))
    assert not before & set(map(row_key, made))  # rows stored by the 2-shard run are not recomputed
    assert shard_files(out)
    run(_config(textfile), out=out, model=lm, on_row=made.append, **QUIET)  # no shard: the rest, then the merge
    assert _bytes(out) == _bytes(single) and not shard_files(out)
    assert len(made) + len(before) == len(read_plan(out).keys())


def test_fresh_with_a_shard_is_refused(lm, textfile, tmp_path):
    with pytest.raises(RunError, match="--fresh with --shard would discard the other shards' rows"):
        run(_config(textfile), out=tmp_path / "run", model=lm, shard=Shard(0, 2), fresh=True, **QUIET)


def _hold(path, text, age=0.0):
    path.write_text(text)
    if age:
        os.utime(path, (time.time() - age, time.time() - age))


def test_locks_between_shards_and_single_runs(lm, textfile, tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    cfg = _config(textfile, tasks=["perplexity"], limit=1)
    host = socket.gethostname()
    # a single-process run holds the folder: a shard stops at once, naming it
    _hold(out / RunFolder.LOCK, f"{os.getpid()} {host} run\n")
    with pytest.raises(RunLocked, match=f"being written by process {os.getpid()}"):
        run(cfg, out=out, model=lm, shard=Shard(0, 2), **QUIET)
    (out / RunFolder.LOCK).unlink()
    # a live shard of another count, or the same shard twice, is refused; so is a single run beside shards
    _hold(out / Shard(0, 3).lock_name, f"{os.getpid()} {host} shard\n")
    with pytest.raises(RunLocked, match="shard 0 of 3 .*run the same shards \\(shard count 3\\)"):
        run(cfg, out=out, model=lm, shard=Shard(0, 2), **QUIET)
    with pytest.raises(RunLocked, match="shard 0 of 3"):
        run(cfg, out=out, model=lm, **QUIET)
    with pytest.raises(RunLocked, match="shard 0 of 3 of .* is already running"):
        run(cfg, out=out, model=lm, shard=Shard(0, 3), **QUIET)
    # a shard lock from another host: live while it beats, stale once silent for STALE_S
    _hold(out / Shard(0, 3).lock_name, "4242 elsewhere shard\n", age=STALE_S / 2)
    with pytest.raises(RunLocked, match="process 4242 on elsewhere"):
        run(cfg, out=out, model=lm, shard=Shard(0, 3), **QUIET)
    _hold(out / Shard(0, 3).lock_name, "4242 elsewhere shard\n", age=STALE_S + 60)
    # a brief hold of the folder's lock (another shard starting, a merge) is waited for: the shard's first
    # pause between tries ends the hold (an injected pause, not a clock), and the shard then runs
    import harness.run.lock as lock

    brief = RunLock(out, role="merge")
    brief.acquire()
    pauses = []
    monkeypatch.setattr(lock, "_pause", lambda s: pauses.append(s) or brief.release())
    run(cfg, out=out, model=lm, shard=Shard(0, 3), **QUIET)
    assert pauses == [0.05]  # waited (once) while the hold lasted, then ran
    assert not (out / Shard(0, 3).lock_name).exists()


def test_the_held_lock_beats(tmp_path, monkeypatch):
    """The heartbeat thread refreshes the lock's time each HEARTBEAT_S while held and stops on release;
    its waits are injected (events), so nothing here depends on how fast the thread runs."""
    import harness.run.lock as lock

    due, beaten, waits = threading.Event(), threading.Event(), []
    real = lock._next_beat

    def next_beat(stop, seconds):
        if threading.current_thread().name != "heartbeat x":  # another lock's heartbeat: as it was
            return real(stop, seconds)
        waits.append(seconds)
        if len(waits) == 1:
            return not due.wait(60)  # the first beat falls due when the test says so
        beaten.set()  # the first beat is done: hold until released, as the real wait does
        return stop.wait()

    monkeypatch.setattr(lock, "_next_beat", next_beat)
    with RunLock(tmp_path, "x", role="shard"):
        old = time.time() - 1000
        os.utime(tmp_path / "x", (old, old))
        due.set()
        assert beaten.wait(60)
        assert (tmp_path / "x").stat().st_mtime > old + 900
        assert lock.owner(tmp_path / "x") == (os.getpid(), socket.gethostname(), "shard")
    assert waits == [lock.HEARTBEAT_S] * 2 and not (tmp_path / "x").exists()


def test_where_a_shard_comes_from():
    assert Shard.parse("1/3") == Shard(1, 3) and Shard.parse(" 0 / 2 ").tag == "shard-0-of-2"
    for bad in ("3/3", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(RunError, match="--shard"):
            Shard.parse(bad)
    assert Shard.from_env({}) is None
    assert Shard.from_env({"RANK": "2", "WORLD_SIZE": "4", "SLURM_ARRAY_TASK_ID": "0",
                           "SLURM_ARRAY_TASK_COUNT": "9"}) == Shard(2, 4)  # torchrun's wins
    assert Shard.from_env({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5",
                           "SLURM_ARRAY_TASK_COUNT": "3"}) == Shard(2, 3)
    with pytest.raises(RunError, match="use a dense array"):
        Shard.from_env({"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_COUNT": "3"})
    with pytest.raises(RunError, match="not integers"):
        Shard.from_env({"RANK": "x", "WORLD_SIZE": "2"})
    # torchrun: each process narrowed to its local GPU (before CUDA starts), unless pinned already
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert pin_local_gpu(env) == "1" and env["CUDA_VISIBLE_DEVICES"] == "1"
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "4,6"}
    assert pin_local_gpu(env) == "6" and env["CUDA_VISIBLE_DEVICES"] == "6"
    for env in ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "3"}, {"LOCAL_RANK": "0"}, {}):
        before = dict(env)
        assert pin_local_gpu(env) is None and env == before


def test_shard_from_the_environment_through_the_cli(lm, textfile, tmp_path, monkeypatch):
    """`harness run` under torchrun's variables runs its shard; the last shard merges."""
    from harness.cli import main as cli
    from harness import runner

    seen = []
    orig = runner.run
    monkeypatch.setattr(runner, "run", lambda *a, **kw: seen.append(kw["shard"]) or orig(*a, model=lm, **kw))
    args = ["run", "--model", "hf", "--model-path", "(tiny)", "--task", "perplexity", "--codec", "octopus", "--bits",
            "2", "--prompts", str(textfile), "--limit", "1", "--residual", "8", "--codec-seeds", "0", "--quiet",
            "--out", str(tmp_path / "run")] + [x for o, v in OPTS["perplexity"].items()
                                              for x in ("--task-opt", f"perplexity.{o}={v}")]
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert cli.main(args) == 0
    assert seen == [Shard(1, 2, "RANK=1 WORLD_SIZE=2"), Shard(0, 2, "RANK=0 WORLD_SIZE=2")]
    assert len(read_rows(tmp_path / "run" / "rows.jsonl")) == 2 and not shard_files(tmp_path / "run")
    monkeypatch.setenv("RANK", "0")
    assert cli.main(args + ["--shard", "0/1"]) == 0  # --shard wins over the environment


def test_shards_on_devices_that_batch_otherwise_keep_one_plan(lm, textfile, tmp_path, monkeypatch):
    """--batch-size left out resolves per device (8 on a CPU, 16 on CUDA) while config.json stays the
    same: a shard started where batches are smaller must keep the batches the run's plan already
    has, or the two shards would deal different batches (rows run twice, others never). The run
    completes with every row once, byte-identical to one process batching as the first did."""
    import harness.run.config as hc

    opts = {"perplexity": {**OPTS["perplexity"], "batch": 0}}

    def cfg():
        c = _config(textfile, tasks=["perplexity"])
        c.task_options = opts
        return c

    monkeypatch.setitem(hc.AUTO_BATCH_SIZE, "cpu", 2)
    single = run(cfg(), out=tmp_path / "single", model=lm, **QUIET)
    out, made = tmp_path / "run", []
    run(cfg(), out=out, model=lm, shard=Shard(0, 2), on_row=made.append, **QUIET)
    monkeypatch.setitem(hc.AUTO_BATCH_SIZE, "cpu", 1)  # the second shard's "device" batches one by one
    notes = []
    run(cfg(), out=out, model=lm, shard=Shard(1, 2), on_row=made.append, progress=False, log=notes.append)
    assert any("keeping the batches" in n for n in notes)
    keys = [row_key(r) for r in made]
    assert len(set(keys)) == len(keys) == len(read_plan(out).keys())
    assert read_plan(out) == read_plan(single)
    assert _bytes(out) == _bytes(single)
