// The host's top K selection (top_k.h) on softmax-like rows: every case is
// first checked against a full stable sort of each row (indices equal, NaN
// first, ties lower index first), then timed (best of 7 runs, one thread),
// and printed as a table. Usage: top_k_bench (no arguments).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "server/rpc/top_k.h"

namespace softmax::server {
namespace {

struct Case {
  DType dtype;
  int64_t rows, n;
};

// Softmax-like values: tiny positives, many alike once rounded to the dtype.
std::vector<char> Rows(const Case& c) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<char> data(static_cast<size_t>(c.rows * c.n) * ItemSize(c.dtype));
  for (int64_t i = 0; i < c.rows * c.n; ++i) {
    StoreFromFloat(data.data(), c.dtype, i, std::exp(normal(rng)) / static_cast<float>(c.n));
  }
  return data;
}

// True when `indices` are each row's first k of a stable sort by value.
bool MatchesASort(const Case& c, const std::vector<char>& data, int64_t k,
                  const std::vector<int64_t>& indices) {
  std::vector<int64_t> order(static_cast<size_t>(c.n));
  for (int64_t r = 0; r < c.rows; ++r) {
    const auto at = [&](int64_t j) { return LoadAsFloat(data.data(), c.dtype, r * c.n + j); };
    for (int64_t j = 0; j < c.n; ++j) order[j] = j;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      if (std::isnan(at(a)) != std::isnan(at(b))) return std::isnan(at(a));
      return at(a) > at(b);
    });
    if (!std::equal(order.begin(), order.begin() + k, indices.begin() + r * k)) return false;
  }
  return true;
}

int Run() {
  const Case cases[] = {{DType::kBFloat16, 64, 32000},
                        {DType::kBFloat16, 8, 131072},
                        {DType::kBFloat16, 1024, 4096},
                        {DType::kFloat32, 64, 32000},
                        {DType::kFloat16, 64, 32000}};
  std::printf("| dtype | rows x n | K | ms | Melem/s |\n|---|---|---:|---:|---:|\n");
  for (const Case& c : cases) {
    const std::vector<char> data = Rows(c);
    for (int64_t k : {5, 64}) {
      std::vector<char> values(static_cast<size_t>(c.rows * k) * ItemSize(c.dtype));
      std::vector<int64_t> indices(static_cast<size_t>(c.rows * k));
      const SoftmaxShape shape{c.rows, c.n, 1};
      SelectTopK(data.data(), c.dtype, shape, k, values.data(), indices.data());
      if (!MatchesASort(c, data, k, indices)) {
        std::fprintf(stderr, "top_k_bench: %s %lld x %lld K = %lld differs from a sort\n",
                     DTypeName(c.dtype), static_cast<long long>(c.rows),
                     static_cast<long long>(c.n), static_cast<long long>(k));
        return 1;
      }
      double best_ms = 1e30;
      for (int run = 0; run < 7; ++run) {
        const auto start = std::chrono::steady_clock::now();
        SelectTopK(data.data(), c.dtype, shape, k, values.data(), indices.data());
        best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(
                                        std::chrono::steady_clock::now() - start).count());
      }
      std::printf("| %s | %lld x %lld | %lld | %.2f | %.0f |\n", DTypeName(c.dtype),
                  static_cast<long long>(c.rows), static_cast<long long>(c.n),
                  static_cast<long long>(k), best_ms,
                  static_cast<double>(c.rows * c.n) / best_ms / 1e3);
    }
  }
  return 0;
}

}  // namespace
}  // namespace softmax::server

int main() { return softmax::server::Run(); }
