"""CUDA kernels compiled at run time (NVRTC through CuPy); GPU only.

- :mod:`.decode_lut`: OCTOPUS decode attention that rebuilds keys with one shared-memory table
  lookup per triplet and feeds keys, probabilities and value codes straight from registers to
  ``mma.sync`` tensor-core products (all query heads of a KV head in one warp tile).
"""
