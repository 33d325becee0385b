"""The question: what can be asked (the vocabulary as enums, and every option declared once with its help,
defaults and checks); the request built from it and checked against a model and a GPU is cost/scenario.py."""
