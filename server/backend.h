// The compute interface under the batcher: a Backend receives whole batches
// of segments and reports completion asynchronously, so an implementation can
// pipeline several batches (e.g. a GPU worker packing batch k+1 on one stream
// while batch k runs on another).
//
// Implementations: CpuBackend (cpu_backend.h); the CUDA DeviceWorker.
#ifndef SOFTMAX_SERVER_BACKEND_H_
#define SOFTMAX_SERVER_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"

namespace softmax::server {

struct WorkItem;  // batcher.h; opaque to backends.

// One request's share of a batch: a contiguous [outer, n, inner] tensor.
struct Segment {
  const void* input = nullptr;  // points into the request's data; not owned
  void* output = nullptr;       // the response's data, already sized; not owned
  int64_t bytes = 0;            // input bytes == output bytes
  DType dtype = DType::kFloat32;
  SoftmaxShape shape;
  SoftmaxOptions options;
};

// A batch formed by the batcher. Backends read `segments` and write each
// segment's output; `items` belongs to the batcher and must not be touched.
struct Batch {
  std::vector<Segment> segments;
  int64_t rows = 0;   // sum of segments' shape.rows()
  int64_t bytes = 0;  // sum of segments' input bytes
  std::vector<std::unique_ptr<WorkItem>> items;  // parallel to segments

  Batch();
  ~Batch();
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
};

// What a backend reports for a finished batch.
struct BatchResult {
  // OK, or the error every request of the batch fails with (INTERNAL for a
  // device fault, RESOURCE_EXHAUSTED when out of memory).
  absl::Status status;
  int64_t compute_ns = 0;  // time the backend spent on this batch
};

class Backend {
 public:
  // Called exactly once per submitted batch, from any thread other than the
  // caller of Submit is allowed (it may also run inline). Returns the batch.
  using Done = std::function<void(std::unique_ptr<Batch>, BatchResult)>;

  virtual ~Backend() = default;

  // Short human-readable description for the start-up log, e.g. "cpu threads=8".
  virtual std::string Describe() const = 0;

  // How many batches the batcher may have submitted and not yet completed.
  // A pipelining GPU worker returns 2 or more.
  virtual int MaxBatchesInFlight() const { return 1; }

  // Starts computing `batch`; must return promptly (no waiting for the
  // result). REQUIRES: fewer than MaxBatchesInFlight() batches outstanding.
  virtual void Submit(std::unique_ptr<Batch> batch, Done done) = 0;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_BACKEND_H_
