"""The service benchmark (run.py) and its breakdown (breakdown.py)."""
