"""Studies: one module per question (reproduction, ablation, convolutions, BF16 external validation, what-if, live
GPU runs). They predict only through the engine or a registered predictor of the core below them, and hold no
Markdown or figure code; the reports above them turn their tables into notebooks, figures and SUMMARY.md.

Rule (tests/test_layers.py): a study may import the core and other studies, never a report."""
