// What a launch costs the host, against the size of the kernel's parameters
// (24 bytes, or 3,096 as TableArgs with its 64 inline entries), the
// programmatic-dependent attribute and a cluster dimension: five launches of
// an empty 16-block kernel in a row, as a table's schedule makes them, 200
// times, 5 repetitions. "host" is the time in cudaLaunchKernelEx per launch;
// "stream" is the stream's time per launch (CUDA events), which equals host
// wherever the GPU waits for the launches.
//
//   nvcc -std=c++17 -O2 -arch=sm_90a -o launch_cost kernels/bench/launch_cost.cu
//   ./launch_cost
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_bench.h"

struct Small {
  int* out;
  int count;
  int pad[3];
};
struct Big {
  int* out;
  int count;
  int pad[3];
  char entries[64 * 48];
};

template <typename A>
__global__ void Empty(A a) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0 && a.count == 12345) a.out[blockIdx.x] = 1;
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

template <typename A>
void Launch(const A& a, bool pdl, unsigned cluster, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(16);
  config.blockDim = dim3(256);
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  if (pdl) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  CK(cudaLaunchKernelEx(&config, Empty<A>, a));
}

template <typename A>
void Time(const char* name, bool pdl, unsigned cluster) {
  constexpr int kLaunches = 5, kIterations = 200, kRepetitions = 5;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  A a = {};
  CK(cudaMalloc(&a.out, 4096));
  for (int i = 0; i < 20; ++i) {
    for (int k = 0; k < kLaunches; ++k) Launch(a, pdl && k > 0, cluster, stream);
  }
  CK(cudaStreamSynchronize(stream));
  const BackToBack t = TimeBackToBack(stream, kIterations, kRepetitions, [&] {
    for (int k = 0; k < kLaunches; ++k) Launch(a, pdl && k > 0, cluster, stream);
  });
  const double launches = double(kLaunches) * kIterations * kRepetitions;
  printf("| %-5s | %5zu | %d | %u | %5.2f | %5.2f |\n", name, sizeof(A), pdl ? 1 : 0, cluster,
         t.host_us / launches, t.stream_us / launches);
  CK(cudaFree(a.out));
  CK(cudaStreamDestroy(stream));
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s\n\n| parameters | bytes | programmatic | cluster | host, us/launch | stream, us/launch |\n"
         "|---|---:|---:|---:|---:|---:|\n", prop.name);
  for (unsigned cluster : {1u, 2u}) {
    for (bool pdl : {false, true}) {
      Time<Small>("small", pdl, cluster);
      Time<Big>("big", pdl, cluster);
    }
  }
  return 0;
}
