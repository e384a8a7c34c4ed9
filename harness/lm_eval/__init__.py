"""lm-evaluation-harness: the model `kvcodec`, the sweep over codecs and its table."""
