// Host side of the top_k kernel (top_k.cuh): its geometry, scratch and
// launches (LaunchSoftmaxTopK in softmax_cuda.h). The geometry reads only n
// and the dtype, never the launch plan or the other segments.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/top_k.cuh"
#include "kernels/softmax_cuda.h"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

// Vectors of a part for rows of `vectors`: whole groups of every warp, and
// no more than kTopKMaxParts parts per row.
long long TopKPartVectorsOf(long long vectors) {
  const long long groups = CeilDiv(vectors, kTopKPartVectors);
  return kTopKPartVectors * std::max(1LL, CeilDiv(groups, kTopKMaxParts));
}

struct TopKShape {
  long long rows;
  long long part_vectors;
  int parts;
};

TopKShape TopKShapeOf(DType dtype, const TopKSegment& s) {
  const long long vectors = CeilDiv(s.n, Vectors(dtype));
  TopKShape shape;
  shape.rows = s.outer * s.inner;
  shape.part_vectors = TopKPartVectorsOf(vectors);
  shape.parts = static_cast<int>(CeilDiv(vectors, shape.part_vectors));
  return shape;
}

bool TopKEmpty(const TopKSegment& s) { return s.outer == 0 || s.inner == 0; }

// Scratch of the segments of several parts: every counter first (one
// memset), then per segment its partials and keys, each region 256-byte aligned.
struct TopKScratch {
  size_t counters_bytes = 0;
  size_t total = 0;
  std::vector<size_t> counters;  // per segment: offset of its counters
  std::vector<size_t> partials;
  std::vector<size_t> keys;
};

TopKScratch TopKScratchOf(DType dtype, const TopKSegment* segments, int count) {
  TopKScratch layout;
  layout.counters.assign(count, 0);
  layout.partials.assign(count, 0);
  layout.keys.assign(count, 0);
  size_t counters = 0;
  for (int i = 0; i < count; ++i) {
    if (TopKEmpty(segments[i])) continue;
    const TopKShape shape = TopKShapeOf(dtype, segments[i]);
    if (shape.parts <= 1) continue;
    layout.counters[i] = counters;
    counters += Align256(static_cast<size_t>(shape.rows) * sizeof(unsigned));
  }
  layout.counters_bytes = counters;
  size_t offset = counters;
  for (int i = 0; i < count; ++i) {
    if (TopKEmpty(segments[i])) continue;
    const TopKShape shape = TopKShapeOf(dtype, segments[i]);
    if (shape.parts <= 1) continue;
    const size_t units = static_cast<size_t>(shape.rows) * shape.parts;
    layout.partials[i] = offset;
    offset += Align256(units * sizeof(float2));
    layout.keys[i] = offset;
    offset += Align256(units * static_cast<size_t>(segments[i].k) * sizeof(unsigned long long));
  }
  layout.total = offset;
  return layout;
}

template <typename T>
cudaError_t LaunchTyped(DType dtype, const TopKSegment& s, const TopKShape& shape, char* scratch,
                        const TopKScratch& layout, int index, cudaStream_t stream, int* launches) {
  TopKArgs a = {};
  a.input = s.input;
  a.values = s.values;
  a.indices = s.indices;
  a.outer = s.outer;
  a.n = s.n;
  a.inner = s.inner;
  a.part_vectors = shape.part_vectors;
  a.parts = shape.parts;
  a.k = static_cast<int>(s.k);
  a.scale = static_cast<float>(kLog2e / static_cast<double>(s.temperature));
  a.log = s.log ? 1 : 0;
  if (shape.parts > 1) {
    a.counters = reinterpret_cast<unsigned*>(scratch + layout.counters[index]);
    a.partials = reinterpret_cast<float2*>(scratch + layout.partials[index]);
    a.keys = reinterpret_cast<unsigned long long*>(scratch + layout.keys[index]);
  }
  const bool vec = s.inner == 1 && Aligned16(s.input) && (s.n * ItemSize(dtype)) % 16 == 0;
  void (*kernel)(TopKArgs) = s.inner != 1 ? TopKKernel<T, kTopKStrided>
                             : vec        ? TopKKernel<T, kTopKVectors>
                                          : TopKKernel<T, kTopKElements>;
  // Launches of at most 2^31 - 1 blocks.
  const long long rows_per_launch = 0x7fffffffLL / shape.parts;
  for (long long first = 0; first < shape.rows; first += rows_per_launch) {
    a.first_row = first;
    const long long rows = std::min(rows_per_launch, shape.rows - first);
    kernel<<<static_cast<unsigned>(rows * shape.parts), kTopKThreads, 0, stream>>>(a);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
    ++*launches;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace detail

size_t SoftmaxTopKScratchBytes(DType dtype, const TopKSegment* segments, int count) {
  if (count <= 0 || segments == nullptr) return 0;
  return detail::TopKScratchOf(dtype, segments, count).total;
}

cudaError_t LaunchSoftmaxTopK(DType dtype, const TopKSegment* segments, int count, void* scratch,
                              size_t scratch_bytes, cudaStream_t stream, int* kernel_launches) {
  if (count < 0 || (count > 0 && segments == nullptr)) return cudaErrorInvalidValue;
  for (int i = 0; i < count; ++i) {
    const TopKSegment& s = segments[i];
    if (s.outer < 0 || s.inner < 0 || s.n < 1 || s.n >= (1LL << 31)) return cudaErrorInvalidValue;
    if (s.k < 1 || s.k > kMaxFusedTopK || s.k > s.n) return cudaErrorInvalidValue;
    if (detail::TopKEmpty(s)) continue;
    if (s.input == nullptr || s.values == nullptr || s.indices == nullptr ||
        !(s.temperature > 0.0f) || !std::isfinite(s.temperature)) {
      return cudaErrorInvalidValue;
    }
  }
  const detail::TopKScratch layout = detail::TopKScratchOf(dtype, segments, count);
  if (layout.total > scratch_bytes || (layout.total > 0 && scratch == nullptr)) {
    return cudaErrorInvalidValue;
  }
  char* bytes = static_cast<char*>(scratch);
  if (layout.counters_bytes > 0) {
    const cudaError_t error = cudaMemsetAsync(bytes, 0, layout.counters_bytes, stream);
    if (error != cudaSuccess) return error;
  }
  int launches = 0;
  for (int i = 0; i < count; ++i) {
    const TopKSegment& s = segments[i];
    if (detail::TopKEmpty(s)) continue;
    const detail::TopKShape shape = detail::TopKShapeOf(dtype, s);
    cudaError_t error = cudaErrorInvalidValue;
    switch (dtype) {
      case DType::kFloat32:
        error = detail::LaunchTyped<float>(dtype, s, shape, bytes, layout, i, stream, &launches);
        break;
      case DType::kFloat16:
        error = detail::LaunchTyped<__half>(dtype, s, shape, bytes, layout, i, stream, &launches);
        break;
      case DType::kBFloat16:
        error = detail::LaunchTyped<__nv_bfloat16>(dtype, s, shape, bytes, layout, i, stream,
                                                   &launches);
        break;
    }
    if (error != cudaSuccess) return error;
  }
  if (kernel_launches != nullptr) *kernel_launches = launches;
  return cudaSuccess;
}

}  // namespace gpu
}  // namespace softmax
