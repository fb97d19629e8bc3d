"""softmax-serve's benchmarks, run as modules from the checkout root
(python3 -m bench.service.run ...); bench.lib holds what they share."""
