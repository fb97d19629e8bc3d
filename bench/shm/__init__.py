"""Shared memory against plain gRPC (shm_bench.py)."""
