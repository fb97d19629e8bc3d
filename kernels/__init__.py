"""Makes kernels/ a Python package for its GPU benchmarks (kernels.bench), so
that `python3 -m kernels.bench.NAME` from the checkout root finds this folder
before any installed package of the same name."""
