"""The KV caches engines deploy, bit-exact: one file per engine family (vllm_kv, vllm_turboquant, sglang_kv,
hf_quantized, llamacpp, mlx, exllama, lmdeploy, trtllm), on their shared preset (preset.py)."""
