"""The KV caches engines deploy, bit-exact: one file per engine family, on their shared preset."""
