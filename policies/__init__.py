"""The scheduling policies, pure (one file each, behind registry.py); perf_models/ and actions/ beside them."""
