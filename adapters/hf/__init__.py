"""Any transformers decoder behind the compressed cache."""
