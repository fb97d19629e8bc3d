"""Code shared by the benchmarks under bench/ and the end-to-end tests.

  server      starting softmax-server on free loopback ports; its "listening" line
  reference   the float64 softmax and the one tolerance contract
  tensors     softmax.v1 tensors and requests from NumPy (needs the generated stubs)
  load        one `softmax-client load` run and its JSON report
  plot        requests/s and p99 against concurrency (matplotlib)
  h2          a raw HTTP/2 client for the abuse cases
  gpu_stage.sh  staging for the GPU machine (sourced by bench/*/stage.sh, run_h200.sh)

Import as a package from the checkout root (python3 -m bench.NAME.run puts
it on sys.path; ctest sets PYTHONPATH).
"""
