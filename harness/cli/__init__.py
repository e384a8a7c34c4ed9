"""The `harness` command: the dispatch and each command's typed arguments."""
