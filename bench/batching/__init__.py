"""The batching benchmark (run.py)."""
