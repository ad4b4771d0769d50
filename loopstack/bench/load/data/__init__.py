"""Vendored data of the GPU plan (config.json figures of shipped architectures)."""
