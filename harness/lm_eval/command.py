"""``harness lm-eval``: lm-eval's own command line with the ``kvcodec`` model (:mod:`harness.lm_eval.model`)
registered, its results carrying the cache's statistics as a top-level key; and :func:`evaluator`, the
``simple_evaluate`` the lm-eval sweep runs."""
from __future__ import annotations

import sys
from contextlib import contextmanager

from harness.lm_eval.model import MODEL_NAME  # importing it registers the kvcodec model with lm-eval


@contextmanager
def _kvcodec_key_on_top():
    """While lm-eval's CLI runs: its ``simple_evaluate`` results get the ``kvcodec`` statistics as a
    top-level key (moved from ``config``) before the CLI saves them."""
    import lm_eval
    from lm_eval import evaluator

    original, shadowed = evaluator.simple_evaluate, lm_eval.__dict__.get("simple_evaluate")

    def simple_evaluate(*args, **kwargs):
        results = original(*args, **kwargs)
        if results is not None and MODEL_NAME in results.get("config", {}):
            results[MODEL_NAME] = results["config"].pop(MODEL_NAME)
        return results

    lm_eval.simple_evaluate = simple_evaluate  # the CLI does `from lm_eval import simple_evaluate` when it runs
    try:
        yield
    finally:
        if shadowed is None:
            del lm_eval.simple_evaluate  # back to the package's lazy attribute
        else:
            lm_eval.simple_evaluate = shadowed


def evaluator(include_path: str, tasks: list[str]):
    """``evaluate(model, model_args) -> results``: lm-eval's ``simple_evaluate`` of ``tasks`` over one index of
    the tasks under ``include_path`` only, on the CPU, batch 1, samples logged (``harness lm-eval-sweep``)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=include_path, include_defaults=False)

    return lambda model, model_args: lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=tasks, batch_size=1, device="cpu", log_samples=True, task_manager=tm)


def main(argv: list[str]) -> int:
    """``harness lm-eval ARGS...``: lm-eval's command line with the ``kvcodec`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        with _kvcodec_key_on_top():
            cli_evaluate()
    finally:
        sys.argv = saved
    return 0
