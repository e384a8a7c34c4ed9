"""Measurement scripts whose figures the docs publish (README.md, docs/*.md cite them). Run each from
the repository root as a module, ``python -m scripts.NAME [options]``, so that the project imports as
installed or from the root; they use only the public names of :mod:`harness.bench` and the packages."""
