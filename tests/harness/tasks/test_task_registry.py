"""harness/tasks: registration rejects a duplicate name or an undeclared metric; an unknown task
lists what exists."""
from __future__ import annotations

import pytest

from harness.tasks import TASKS, Task, get_task, list_tasks, register_task


def test_duplicate_task_name_is_rejected():
    existing = get_task("perplexity")
    with pytest.raises(ValueError, match=r"task 'perplexity' registered twice: by harness\.tasks\.perplexity\.\w+ "
                                         r"and by .*test_duplicate_task_name_is_rejected\.<locals>\.Other$"):
        @register_task("perplexity")
        class Other(Task):
            modality = "text"
    assert TASKS["perplexity"] is existing


def test_declared_metrics_must_exist_for_the_tasks_modality():
    with pytest.raises(ValueError, match="Unknown metric 'bleu'. Available:"):
        @register_task("test-bleu")
        class Bleu(Task):
            modality = "text"
            metrics = ("bleu",)
    with pytest.raises(ValueError, match="metric 'psnr' has no 'text' implementation. Available: video"):
        @register_task("test-psnr")
        class Psnr(Task):
            modality = "text"
            metrics = ("psnr",)
    assert "test-bleu" not in TASKS and "test-psnr" not in TASKS


def test_unknown_task_lists_what_exists():
    with pytest.raises(ValueError) as e:
        get_task("perplexty")
    msg = str(e.value)
    assert msg.startswith("Unknown task 'perplexty'. Available: ")
    assert all(name in msg for name in list_tasks())


def test_task_metric_is_the_registry_implementation_for_its_modality():
    from metrics import get_metric
    from metrics.text import kl_topk

    task = get_task("perplexity")()
    assert task.metric("kl") is get_metric("kl").impl("text") is kl_topk
