"""The fleet benchmark behind Envoy (bench.py)."""
