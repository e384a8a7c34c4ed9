"""One run's inputs and its folder: the typed configuration, flags, rows, the run folder, its lock and plan, the environment, input files and the checks made before a model loads."""
