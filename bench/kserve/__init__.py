"""KServe v2 benchmarks: protocols.py, pa_bench.py (perf_analyzer, PyTriton), summarise.py."""
