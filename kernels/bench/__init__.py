"""The kernels' GPU benchmarks: run from the checkout root as
`python3 -m kernels.bench.NAME` (the checkout on sys.path, as for bench/), so
that they import each other as kernels.bench.NAME and share bench.lib (the
float64 reference and tolerance contract in bench.lib.reference)."""
