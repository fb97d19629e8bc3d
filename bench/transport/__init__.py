"""The transport benchmark (run.py)."""
