#include "server/rpc/top_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace softmax::server {
namespace {

// The ranking of top_k.h: true when element a (value va) comes before b.
// A strict total order over a row's indices, so the selection is unique.
inline bool RanksBefore(float va, int64_t a, float vb, int64_t b) {
  const bool nan_a = std::isnan(va);
  const bool nan_b = std::isnan(vb);
  if (nan_a != nan_b) return nan_a;
  if (!nan_a && va != vb) return va > vb;
  return a < b;
}

}  // namespace

void SelectTopK(const void* data, DType dtype, const SoftmaxShape& shape, int64_t k,
                void* values, int64_t* indices) {
  if (k <= 0 || shape.rows() == 0) return;
  const int64_t n = shape.n;
  const int64_t inner = shape.inner;
  const int item = ItemSize(dtype);
  std::vector<float> row(static_cast<size_t>(n));
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < shape.outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * n * inner + i;  // element (o, 0, i)
      for (int64_t j = 0; j < n; ++j) row[j] = LoadAsFloat(data, dtype, base + j * inner);
      std::iota(order.begin(), order.end(), int64_t{0});
      const auto before = [&row](int64_t a, int64_t b) { return RanksBefore(row[a], a, row[b], b); };
      // O(n log k): a heap of the K best so far, each element compared with its worst.
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      const int64_t out_base = o * k * inner + i;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t out = out_base + j * inner;
        std::memcpy(static_cast<char*>(values) + out * item,
                    static_cast<const char*>(data) + (base + order[j] * inner) * item, item);
        indices[out] = order[j];
      }
    }
  }
}

std::vector<int64_t> TopKDims(const std::vector<int64_t>& dims, int axis, int64_t k) {
  std::vector<int64_t> out = dims;
  if (!out.empty()) out[axis] = k;
  return out;
}

}  // namespace softmax::server
