// The top K of a tensor selected on the host: the K largest values of every
// row along the axis and their indices. The backends compute a request's top
// K themselves from its input (Segment::top_k: the GPU's fused kernel, or
// CpuSoftmaxTopKRows); this selection serves echo mode, whose answer is the
// input itself, and the benchmarks.
//
// Order: the backends' (kernels/cpu_softmax.h): by value descending
// (compared widened to float, exactly); equal values come lower index first
// (+0 equals -0); NaN ranks above every number (as torch.topk), NaNs lower
// index first. Applied to a request's input it is the ranking every answer
// has, whatever K or backend. The selection reads only the row, so it is
// the same whatever else was batched.
//
// Thread-safety: pure functions; concurrent calls on disjoint outputs are safe.
#ifndef SOFTMAX_SERVER_RPC_TOP_K_H_
#define SOFTMAX_SERVER_RPC_TOP_K_H_

#include <cstdint>
#include <vector>

#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"

namespace softmax::server {

// For each of shape.rows() rows of `data` ([outer, n, inner] of `dtype`),
// writes its K largest elements, in the order above, to `values` ([outer, k,
// inner] of `dtype`, the elements copied bit for bit) and their indices along
// the axis to `indices` ([outer, k, inner]).
// REQUIRES: 0 <= k <= shape.n; `values` holds rows * k elements of `dtype`,
// `indices` rows * k.
void SelectTopK(const void* data, DType dtype, const SoftmaxShape& shape, int64_t k,
                void* values, int64_t* indices);

// `dims` with dimension `axis` replaced by k: the shape of a top K's values
// and indices. A scalar's (empty dims) stays empty.
std::vector<int64_t> TopKDims(const std::vector<int64_t>& dims, int axis, int64_t k);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_TOP_K_H_
