// CPU backend: one execution slot whose thread splits each batch's rows
// (over all its segments) into tasks of roughly equal element counts and runs
// softmax::CpuSoftmaxRows on them (and CpuSoftmaxTopKRows for a segment's
// top K), with a fixed pool of helper threads.
// Correct for every axis; float64 accumulation.
//
// Thread-safety: Execute is called by the scheduler's one slot thread;
// Describe and Device from any thread.
#ifndef SOFTMAX_SERVER_CPU_CPU_BACKEND_H_
#define SOFTMAX_SERVER_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/scheduling/backend.h"

namespace softmax::server {

struct CpuBackendOptions {
  // Threads, the slot's own included; 0 = one per core the process may run
  // on (its CPU affinity), softmax-server's choice. More threads cut compute
  // time for large batches until memory bandwidth saturates.
  int threads = 0;
  // Smallest task, in elements: below this, splitting costs more in
  // hand-offs than it gains in parallelism.
  int64_t min_task_elements = 16384;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options);
  // Joins the helper threads. REQUIRES: no Execute running.
  ~CpuBackend() override;

  std::string Describe() const override;
  // name: the processor's model (/proc/cpuinfo), multiprocessors: worker
  // threads; no memory size, peak bandwidth or occupancy to report.
  DeviceInfo Device() const override;
  std::string Name() const override { return "cpu"; }
  BatchResult Execute(int slot, Batch& batch) override;

  int threads() const { return threads_count_; }

 private:
  struct Job;
  // Rows from (first_segment, first_row) up to (last_segment, last_row_end),
  // in batch order: a task may span many small segments.
  struct Task {
    std::shared_ptr<Job> job;
    int first_segment = 0;
    int64_t first_row = 0;
    int last_segment = 0;
    int64_t last_row_end = 0;
  };
  // Runs one queued task on the calling thread; false when none was queued.
  bool RunOneTask();
  void RunTask(const Task& task);
  void HelperLoop();

  const CpuBackendOptions options_;
  int threads_count_ = 1;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_CPU_CPU_BACKEND_H_
