"""Metrics, registered by name with their direction, scale and display name; no dependency on
kernels/adapters/harness."""
from metrics.registry import METRICS, Metric, define_metric, get_metric, list_metrics, modalities, register_metric

__all__ = ["METRICS", "Metric", "define_metric", "get_metric", "list_metrics", "modalities", "register_metric"]
