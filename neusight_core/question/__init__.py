"""The question: what is asked (the options declared once, the request built and checked, the vocabulary)."""
