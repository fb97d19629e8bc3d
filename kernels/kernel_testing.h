// Test helpers shared by the kernels' tests: the element types to sweep and
// the vector width the kernels load by. Header-only, for tests; no CUDA.
#ifndef SOFTMAX_KERNELS_KERNEL_TESTING_H_
#define SOFTMAX_KERNELS_KERNEL_TESTING_H_

#include "kernels/dtype.h"

namespace softmax {

// Every element type, in wire order.
inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// Elements of `dtype` in one 16-byte vector load.
inline constexpr int VecWidth(DType dtype) { return 16 / ItemSize(dtype); }

}  // namespace softmax

#endif  // SOFTMAX_KERNELS_KERNEL_TESTING_H_
