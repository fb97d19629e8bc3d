// Benchmark of the CPU backend's row routine (CpuSoftmaxRows, one thread):
// validates every case against the float64 reference first, then times it and
// prints a table of milliseconds and elements per second.
//
//   build/bin/cpu_softmax_bench
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_softmax.h"

namespace softmax {
namespace {

struct Case {
  DType dtype;
  SoftmaxShape shape;
  SoftmaxOptions options;
};

std::string MakeInput(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::string input(c.shape.elements() * ItemSize(c.dtype), '\0');
  for (int64_t i = 0; i < c.shape.elements(); ++i) {
    StoreFromFloat(input.data(), c.dtype, i, normal(rng));
  }
  return input;
}

int Run() {
  const Case cases[] = {
      {DType::kFloat32, {4096, 1024, 1}, {}},
      {DType::kFloat32, {4096, 1024, 1}, {1.0f, true}},
      {DType::kFloat32, {256, 1024, 16}, {0.5f, false}},  // non-last axis
      {DType::kFloat16, {512, 4096, 1}, {}},
      {DType::kBFloat16, {64, 32000, 1}, {}},
  };
  std::mt19937 rng(2026);
  std::printf("%-9s %-18s %-5s %-5s %10s %12s\n", "dtype", "[outer, n, inner]", "T", "log", "ms",
              "Melem/s");
  int failures = 0;
  for (const Case& c : cases) {
    const std::string input = MakeInput(c, rng);
    std::string output(input.size(), '\xff');  // poisoned: NaN in every dtype
    CpuSoftmaxRows(input.data(), output.data(), c.dtype, c.shape, c.options, 0, c.shape.rows());
    std::vector<double> reference(c.shape.elements());
    ReferenceSoftmax(input.data(), c.dtype, c.shape, c.options, reference.data());
    int64_t bad = 0;
    for (int64_t i = 0; i < c.shape.elements(); ++i) {
      bad += !WithinReferenceTolerance(LoadAsFloat(output.data(), c.dtype, i), reference[i],
                                       c.dtype);
    }
    if (bad != 0) {
      std::printf("%s: %lld elements out of tolerance; not timed\n", DTypeName(c.dtype),
                  static_cast<long long>(bad));
      ++failures;
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    int reps = 0;
    while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500)) {
      CpuSoftmaxRows(input.data(), output.data(), c.dtype, c.shape, c.options, 0,
                     c.shape.rows());
      ++reps;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
    char shape[64];
    std::snprintf(shape, sizeof shape, "[%lld, %lld, %lld]",
                  static_cast<long long>(c.shape.outer), static_cast<long long>(c.shape.n),
                  static_cast<long long>(c.shape.inner));
    std::printf("%-9s %-18s %-5.2g %-5s %10.3f %12.1f\n", DTypeName(c.dtype), shape,
                c.options.temperature, c.options.log ? "yes" : "no", seconds * 1e3,
                c.shape.elements() / seconds / 1e6);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace softmax

int main() { return softmax::Run(); }
