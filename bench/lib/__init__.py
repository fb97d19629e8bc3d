"""Code shared by the benchmarks under bench/ and kernels/bench/ and the
end-to-end tests under tests/.

  server      starting softmax-server on free loopback ports (--listening_file)
  reference   the float64 softmax and the one tolerance contract (NumPy or torch)
  tensors     softmax.v1 tensors and requests from NumPy (needs the generated stubs)
  load        one `softmax-client load` run and its JSON report
  plot        requests/s and p99 against concurrency (matplotlib)
  h2          a raw HTTP/2 client for the abuse cases
  gpu_stage.sh  staging for the GPU machine (sourced by bench/*/stage.sh, run_h200.sh)

Import it as a package with the checkout root on the module path: running
`python3 -m bench.NAME.run` (or kernels.bench.NAME) from the checkout root
does that; ctest and the scripts set PYTHONPATH.
"""
