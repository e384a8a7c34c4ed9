"""The compressed KV cache every model adapter drives: configuration, layers, stores, windows, the shared prefill, and a rollout's clock."""
