// What the standalone CUDA benchmarks of this folder share: a check that ends
// the program on a CUDA error, and the host's and the stream's time of calls
// made back to back.
#ifndef SOFTMAX_KERNELS_BENCH_CUDA_BENCH_H_
#define SOFTMAX_KERNELS_BENCH_CUDA_BENCH_H_

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                          \
  do {                                                                 \
    cudaError_t e = (x);                                               \
    if (e != cudaSuccess) {                                            \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

// Microseconds summed over the repetitions: the host's in the calls, and the
// stream's between events recorded around them.
struct BackToBack {
  double host_us = 0;
  double stream_us = 0;
};

// Makes `calls` calls of call() on `stream`, nothing waited for between them,
// `repetitions` times; each repetition ends with the stream drained.
template <typename Call>
BackToBack TimeBackToBack(cudaStream_t stream, int calls, int repetitions, Call call) {
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  BackToBack t;
  for (int r = 0; r < repetitions; ++r) {
    CK(cudaEventRecord(start, stream));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    t.host_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    CK(cudaEventRecord(stop, stream));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    t.stream_us += ms * 1000.0;
  }
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
  return t;
}

#endif  // SOFTMAX_KERNELS_BENCH_CUDA_BENCH_H_
