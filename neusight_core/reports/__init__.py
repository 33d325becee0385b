"""Reports: tables, figures, verdicts and the run itself (runner, run record, SUMMARY.md). They read what the studies
and the core compute and compute no prediction of their own.

Rule (tests/test_layers.py): nothing below imports a report."""
