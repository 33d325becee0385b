"""Cost: kernel tables to time and memory (the engine, host and network models, latency, sweeps)."""
