"""Reports: tables, figures and verdicts. They read what the studies and the core compute and compute no prediction
of their own.

Rule (tests/test_layers.py): nothing below imports a report; the run (``neusight_core/run/``) above does."""
