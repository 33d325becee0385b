"""NeuSight re-implementation and reproducibility toolkit.

Pipeline (one module per stage): release -> trace -> kernels/tiles -> predictors ->
model latency -> evaluation -> report.
"""

__version__ = "0.1.0"
