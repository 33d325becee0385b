"""Cost: a request checked against its model and GPU, then its kernel tables timed and its memory counted (the
engine, the host and network models, latency, sweeps)."""
