"""Metrics, registered by name with their direction; no dependency on kernels/adapters/harness."""
from .registry import METRICS, Metric, get_metric, list_metrics, register_metric

__all__ = ["METRICS", "Metric", "get_metric", "list_metrics", "register_metric"]
