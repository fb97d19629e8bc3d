// Whether a CUDA graph per schedule would take the host out of a small table's
// way: the host's and the stream's time per call of five launches of an empty
// 16-block kernel with TableArgs-sized parameters (3,096 bytes), as a table's
// schedule makes them, made four ways:
//   direct   five cudaLaunchKernelEx, the later four programmatic (as now);
//   replay   one cudaGraphLaunch of a graph made once (the floor: no new
//            parameters, which a server's batches always bring);
//   capture  the five launches captured on the stream, cudaGraphExecUpdate
//            into the instantiated graph, cudaGraphLaunch;
//   setnode  cudaGraphExecKernelNodeSetParams on each of the five nodes,
//            cudaGraphLaunch;
//   devargs  the five parameter blocks written to pinned memory, one
//            cudaMemcpyAsync to device memory, then the replay of a graph
//            made once whose kernels read their parameters from there.
// Each kernel checks one word of its parameters, so a graph run with stale
// ones is caught. 200 calls, 5 repetitions.
//
//   nvcc -std=c++17 -O2 -arch=sm_90a -o graph_cost kernels/bench/graph_cost.cu
//   ./graph_cost
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_bench.h"

namespace {

constexpr int kLaunches = 5, kCalls = 200, kRepetitions = 5, kBlocks = 16;

struct Big {
  int* out;
  int call;
  int launch;
  int pad[2];
  char entries[64 * 48];
};

// Block 0 writes the call number into its launch's slot: after a run the
// slots hold the last call's number, or a stale graph's.
__global__ void Empty(Big a) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (blockIdx.x == 0 && threadIdx.x == 0) a.out[a.launch] = a.call;
}

// The same, its parameters read from device memory.
__global__ void EmptyFrom(const Big* args, int launch) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (blockIdx.x == 0 && threadIdx.x == 0) args[launch].out[args[launch].launch] = args[launch].call;
}

cudaLaunchConfig_t Config(cudaStream_t stream, bool programmatic, cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kBlocks);
  config.blockDim = dim3(256);
  config.stream = stream;
  attribute->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute->val.programmaticStreamSerializationAllowed = 1;
  config.attrs = programmatic ? attribute : nullptr;
  config.numAttrs = programmatic ? 1 : 0;
  return config;
}

void LaunchFrom(const Big* args, cudaStream_t stream) {
  for (int k = 0; k < kLaunches; ++k) {
    cudaLaunchAttribute attribute;
    cudaLaunchConfig_t config = Config(stream, k > 0, &attribute);
    CK(cudaLaunchKernelEx(&config, EmptyFrom, args, k));
  }
}

void LaunchCall(int* out, int call, cudaStream_t stream) {
  for (int k = 0; k < kLaunches; ++k) {
    Big a = {};
    a.out = out;
    a.call = call;
    a.launch = k;
    cudaLaunchAttribute attribute;
    cudaLaunchConfig_t config = Config(stream, k > 0, &attribute);
    CK(cudaLaunchKernelEx(&config, Empty, a));
  }
}

enum class Way { kDirect, kReplay, kCapture, kSetNode, kDevArgs };
const char* Name(Way way) {
  switch (way) {
    case Way::kDirect: return "direct";
    case Way::kReplay: return "replay";
    case Way::kCapture: return "capture";
    case Way::kSetNode: return "setnode";
    case Way::kDevArgs: return "devargs";
  }
  return "?";
}

struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t nodes[kLaunches] = {};
  cudaGraphExec_t from = nullptr;  // devargs: kernels that read device_args
  Big* pinned = nullptr;           // a slot of kLaunches blocks per call
  Big* device_args = nullptr;
};

cudaGraph_t Capture(int* out, int call, cudaStream_t stream) {
  cudaGraph_t graph;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  LaunchCall(out, call, stream);
  CK(cudaStreamEndCapture(stream, &graph));
  return graph;
}

// The captured graph's kernel nodes in launch order (a chain).
void Nodes(cudaGraph_t graph, cudaGraphNode_t* nodes) {
  size_t count = kLaunches;
  cudaGraphNode_t all[kLaunches];
  CK(cudaGraphGetNodes(graph, all, &count));
  if (count != kLaunches) {
    printf("captured %zu nodes, not %d\n", count, kLaunches);
    exit(1);
  }
  for (int k = 0; k < kLaunches; ++k) {
    cudaKernelNodeParams params;
    CK(cudaGraphKernelNodeGetParams(all[k], &params));
    nodes[static_cast<const Big*>(params.kernelParams[0])->launch] = all[k];
  }
}

void Call(Way way, Graph& g, int* out, int call, cudaStream_t stream) {
  switch (way) {
    case Way::kDirect:
      LaunchCall(out, call, stream);
      return;
    case Way::kReplay:
      CK(cudaGraphLaunch(g.exec, stream));
      return;
    case Way::kCapture: {
      cudaGraph_t graph = Capture(out, call, stream);
      cudaGraphExecUpdateResultInfo info;
      CK(cudaGraphExecUpdate(g.exec, graph, &info));
      CK(cudaGraphDestroy(graph));
      CK(cudaGraphLaunch(g.exec, stream));
      return;
    }
    case Way::kSetNode:
      for (int k = 0; k < kLaunches; ++k) {
        Big a = {};
        a.out = out;
        a.call = call;
        a.launch = k;
        void* args[] = {&a};
        cudaKernelNodeParams params = {};
        params.func = reinterpret_cast<void*>(Empty);
        params.gridDim = dim3(kBlocks);
        params.blockDim = dim3(256);
        params.kernelParams = args;
        CK(cudaGraphExecKernelNodeSetParams(g.exec, g.nodes[k], &params));
      }
      CK(cudaGraphLaunch(g.exec, stream));
      return;
    case Way::kDevArgs: {
      // A slot per call of a repetition: the stream copies it before the host
      // writes it again (each repetition ends in a synchronize).
      Big* slot = g.pinned + (call % kCalls) * kLaunches;
      for (int k = 0; k < kLaunches; ++k) {
        Big& a = slot[k];
        a.out = out;
        a.call = call;
        a.launch = k;
      }
      CK(cudaMemcpyAsync(g.device_args, slot, kLaunches * sizeof(Big), cudaMemcpyHostToDevice, stream));
      CK(cudaGraphLaunch(g.from, stream));
      return;
    }
  }
}

void Time(Way way) {
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int* out;
  CK(cudaMalloc(&out, kLaunches * sizeof(int)));
  CK(cudaMemset(out, 0xff, kLaunches * sizeof(int)));
  Graph g;
  g.graph = Capture(out, 1, stream);
  Nodes(g.graph, g.nodes);
  CK(cudaGraphInstantiate(&g.exec, g.graph, 0));
  CK(cudaMallocHost(&g.pinned, kCalls * kLaunches * sizeof(Big)));
  memset(g.pinned, 0, kCalls * kLaunches * sizeof(Big));
  CK(cudaMalloc(&g.device_args, kLaunches * sizeof(Big)));
  {
    cudaGraph_t from;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    LaunchFrom(g.device_args, stream);
    CK(cudaStreamEndCapture(stream, &from));
    CK(cudaGraphInstantiate(&g.from, from, 0));
    CK(cudaGraphDestroy(from));
  }
  int call = 1;
  for (int i = 0; i < 20; ++i) Call(way, g, out, ++call, stream);
  CK(cudaStreamSynchronize(stream));
  const BackToBack t = TimeBackToBack(stream, kCalls, kRepetitions, [&] { Call(way, g, out, ++call, stream); });
  int seen[kLaunches];
  CK(cudaMemcpy(seen, out, sizeof(seen), cudaMemcpyDeviceToHost));
  const int expected = way == Way::kReplay ? 1 : call;
  bool right = true;
  for (int k = 0; k < kLaunches; ++k) right = right && seen[k] == expected;
  const double calls = double(kCalls) * kRepetitions;
  printf("| %-7s | %6.2f | %6.2f | %s |\n", Name(way), t.host_us / calls, t.stream_us / calls,
         right ? "yes" : "NO");
  CK(cudaGraphExecDestroy(g.exec));
  CK(cudaGraphExecDestroy(g.from));
  CK(cudaFreeHost(g.pinned));
  CK(cudaFree(g.device_args));
  CK(cudaGraphDestroy(g.graph));
  CK(cudaFree(out));
  CK(cudaStreamDestroy(stream));
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d launches per call\n\n| way | host, us/call | stream, us/call | last call's parameters ran |\n"
         "|---|---:|---:|---|\n", prop.name, kLaunches);
  for (Way way : {Way::kDirect, Way::kReplay, Way::kCapture, Way::kSetNode, Way::kDevArgs, Way::kDirect}) Time(way);
  return 0;
}
