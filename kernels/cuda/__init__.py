"""CUDA kernels compiled at run time (NVRTC through CuPy, the optional extra ``cuda``); GPU only.
Importing this package needs neither CUDA nor CuPy: they are asked for at the first launch.

- :mod:`.decode_lut` (source ``decode_lut.cu`` and the ``lut_*.cuh`` parts; parameter structs
  :mod:`.lut_params`, configuration :mod:`.lut_config`): OCTOPUS decode attention that rebuilds keys with
  one shared-memory table lookup per triplet and feeds keys, probabilities and value codes
  straight from registers to ``mma.sync`` tensor-core products (all query heads of a KV head in
  one warp tile). :func:`kernels.attention.decode_attention` picks it first on CUDA.
"""
