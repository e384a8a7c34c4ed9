"""The ``harness`` CLI: seeded rollouts for the uncompressed baseline and each codec, scored and reported."""
