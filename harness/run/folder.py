"""A run folder's files and folders, by name: :class:`RunFolder` is the one place they are written.

    RUN/config.json      the run's configuration (harness.run.config.RunConfig)
    RUN/model.json       what the run ran on (harness.run.environment)
    RUN/registry.json    what the summary needs of the tasks, metrics and codecs (harness.report.run_data)
    RUN/plan.json        the batches and configurations in the order one process runs them (harness.run.plan)
    RUN/rows.jsonl       one line per prompt x configuration x codec seed; speed.jsonl and timings.jsonl
                         beside it, keyed like it (the *line files*, by stem: rows, speed, timings)
    RUN/STEM.shard-I-of-N.jsonl   shard I of N's lines, merged into STEM.jsonl (harness.scale)
    RUN/summary.json, report.md, report.html, plotly.min.js, <task>_<metric>.png   the reports
    RUN/slurm.json, RUN/slurm/   a Slurm array's settings and submitit's files (harness.scale.slurm)
    RUN/.lock, RUN/.lock.shard-I-of-N   who writes the folder (harness.run.lock)
    RUN/logs/shard-I-of-N.log    each launched shard's output (harness.scale.launch)
    RUN/baselines/, RUN/<modality>/   the baselines, the tasks' media
"""
from __future__ import annotations

import re
from pathlib import Path


class RunFolder:
    """The files and folders of the run folder at ``path``. Names are class attributes (a file's name,
    or a line file's stem); paths are properties and methods. A shard is ``(index, count)``."""

    CONFIG, MODEL, REGISTRY, PLAN = "config.json", "model.json", "registry.json", "plan.json"
    SUMMARY, REPORT_MD, REPORT_HTML, PLOTLY_JS = "summary.json", "report.md", "report.html", "plotly.min.js"
    SLURM_JSON = "slurm.json"
    ROWS, SPEED, TIMINGS = "rows", "speed", "timings"  # the line files' stems
    LINE_STEMS = (ROWS, SPEED, TIMINGS)
    LOCK = ".lock"
    BASELINES, LOGS, SLURM_DIR = "baselines", "logs", "slurm"
    #: every top-level file a run writes by a fixed name (the reports' plots aside: :meth:`is_run_file`)
    FILES = (f"{ROWS}.jsonl", SUMMARY, REPORT_MD, REPORT_HTML, PLOTLY_JS, f"{SPEED}.jsonl", f"{TIMINGS}.jsonl",
             MODEL, REGISTRY, CONFIG, PLAN, SLURM_JSON)
    #: the other top-level files a run writes, by exact pattern (so --fresh never takes a user's file): the
    #: shards' line files and atomic_write's temporary files
    PATTERNS = (rf"({'|'.join(LINE_STEMS)})\.shard-\d+-of-\d+\.jsonl",
                "(" + "|".join(re.escape(f) for f in FILES) + r")\.\d+\.tmp",
                r"\.[A-Za-z0-9._-]+\.\d+\.tmp\.(png|html|js|md)")  # rows.write_via's, for a plot or a page
    #: the files of logs/ that are the harness's (the folder goes once empty)
    LOG_PATTERN = r"shard-\d+-of-\d+\.log"

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    # --- names ---------------------------------------------------------------------------------
    @staticmethod
    def shard_tag(index: int, count: int) -> str:
        return f"shard-{index}-of-{count}"

    @classmethod
    def lines_name(cls, stem: str, tag: str | None = None) -> str:
        """``STEM.jsonl``, or a shard's ``STEM.shard-I-of-N.jsonl`` (``tag``: :meth:`shard_tag`)."""
        return f"{stem}.{tag}.jsonl" if tag else f"{stem}.jsonl"

    @classmethod
    def lock_name(cls, tag: str | None = None) -> str:
        return f"{cls.LOCK}.{tag}" if tag else cls.LOCK

    # --- paths ---------------------------------------------------------------------------------
    config = property(lambda self: self.path / self.CONFIG)
    model = property(lambda self: self.path / self.MODEL)
    registry = property(lambda self: self.path / self.REGISTRY)
    plan = property(lambda self: self.path / self.PLAN)
    summary = property(lambda self: self.path / self.SUMMARY)
    report_md = property(lambda self: self.path / self.REPORT_MD)
    report_html = property(lambda self: self.path / self.REPORT_HTML)
    plotly_js = property(lambda self: self.path / self.PLOTLY_JS)
    slurm_json = property(lambda self: self.path / self.SLURM_JSON)
    slurm_dir = property(lambda self: self.path / self.SLURM_DIR)
    logs = property(lambda self: self.path / self.LOGS)
    baselines = property(lambda self: self.path / self.BASELINES)
    rows = property(lambda self: self.lines(self.ROWS))

    def lines(self, stem: str, tag: str | None = None) -> Path:
        return self.path / self.lines_name(stem, tag)

    def lock(self, tag: str | None = None) -> Path:
        return self.path / self.lock_name(tag)

    def log(self, tag: str) -> Path:
        return self.logs / f"{tag}.log"

    def shard_files(self, stem: str) -> dict[tuple[int, int], Path]:
        """The shard files ``STEM.shard-I-of-N.jsonl`` present, ``(I, N) -> path``, ordered by (N, I)."""
        found, pattern = {}, re.compile(re.escape(stem) + r"\.shard-(\d+)-of-(\d+)\.jsonl")
        for p in self.path.glob(f"{stem}.shard-*.jsonl"):
            m = pattern.fullmatch(p.name)
            if m and 0 <= int(m[1]) < int(m[2]):
                found[(int(m[1]), int(m[2]))] = p
        return dict(sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])))

    def shard_locks(self) -> list[Path]:
        return sorted(self.path.glob(f"{self.LOCK}.shard-*"))

    def shard_counts(self) -> list[int]:
        """Shard counts seen (row files and locks), the most recently written first."""
        seen: dict[int, float] = {}
        for p in [*self.path.glob(f"{self.ROWS}.shard-*-of-*.jsonl"), *self.path.glob(f"{self.LOCK}.shard-*-of-*")]:
            tail = p.name.removesuffix(".jsonl").rpartition("-of-")[2]
            if tail.isdigit() and int(tail) > 0:
                try:
                    seen[int(tail)] = max(seen.get(int(tail), 0.0), p.stat().st_mtime)
                except FileNotFoundError:
                    continue
        return sorted(seen, key=lambda n: -seen[n])

    # --- what is the harness's -------------------------------------------------------------------
    def is_run_file(self, name: str, plots: set[str] | frozenset = frozenset()) -> bool:
        """Whether a top-level file ``name`` is one the harness writes (``plots``: the reports' plot names,
        :func:`harness.report.plot_names`)."""
        return name in self.FILES or name in plots or any(re.fullmatch(p, name) for p in self.PATTERNS)

    def not_regular(self) -> list[Path]:
        """The harness's top-level files (and locks) that are, links followed, neither a regular file nor missing:
        a device, a pipe or a socket, or a folder, where reading the file would block or never end (a planted
        ``registry.json -> /dev/zero``). A link to a regular file is read as the file it names."""
        names = (p for p in self.path.iterdir() if self.is_run_file(p.name) or p.name.startswith(self.LOCK))
        return sorted(p for p in names if p.exists() and not p.is_file())

    @classmethod
    def dirs(cls, modalities: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """The folders only the harness writes into: baselines, each modality's media (a task files them
        under its modality's folder: video/, audio/) and submitit's files."""
        return (cls.BASELINES, *modalities, cls.SLURM_DIR)
