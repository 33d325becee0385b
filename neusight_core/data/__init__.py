"""Data: what the forecaster reads (the release, training kernels, measured kernels, GPUs, model configs)."""
