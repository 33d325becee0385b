"""Tracing: a model step into its kernel table (the tracer, its caches, and tables derived by shape)."""
