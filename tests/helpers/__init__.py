"""Helpers the tests share: tiny models, reference figures, derived tolerances, page checks."""
