"""Code shared by the benchmarks under bench/ and the end-to-end tests."""
