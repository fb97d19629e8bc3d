#include "server/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu_softmax.h"
#include "server/thread_name.h"

namespace softmax::server {
namespace {

// The backend whose worker thread this is (null on other threads): a batch
// submitted from a worker (the batcher forms the next batch in the done
// callback) leaves one task for that worker, which loops back for it.
thread_local const CpuBackend* worker_of = nullptr;

}  // namespace

struct CpuBackend::Job {
  std::unique_ptr<Batch> batch;
  Done done;
  std::atomic<int64_t> remaining{0};
  std::chrono::steady_clock::time_point start;
};

CpuBackend::CpuBackend(const CpuBackendOptions& options) : options_(options) {
  int count = options.threads;
  if (count <= 0) count = static_cast<int>(std::thread::hardware_concurrency());
  if (count <= 0) count = 1;
  threads_.reserve(count);
  for (int i = 0; i < count; ++i) {
    threads_.emplace_back([this, i] {
      NameThisThread(absl::StrCat("sm-cpu-", i));
      WorkerLoop();
    });
  }
}

CpuBackend::~CpuBackend() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  for (auto& thread : threads_) thread.join();
}

std::string CpuBackend::Describe() const { return absl::StrCat("cpu threads=", threads_.size()); }

DeviceInfo CpuBackend::Device() const {
  DeviceInfo info;
  info.name = "cpu";
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (!absl::StartsWith(line, "model name")) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      const absl::string_view model = absl::StripAsciiWhitespace(
          absl::string_view(line).substr(colon + 1));
      if (!model.empty()) info.name = std::string(model);
    }
    break;
  }
  info.multiprocessors = static_cast<int>(threads_.size());
  return info;
}

void CpuBackend::Submit(std::unique_ptr<Batch> batch, Done done) {
  auto job = std::make_shared<Job>();
  job->start = std::chrono::steady_clock::now();

  int64_t total_elements = 0;
  for (const Segment& segment : batch->segments) total_elements += segment.shape.elements();
  const int64_t per_thread_share =
      total_elements / (4 * static_cast<int64_t>(threads_.size()) + 1);
  const int64_t target = std::max(options_.min_task_elements, per_thread_share);

  // Tasks of about `target` elements each, cut across segment boundaries:
  // a batch of a hundred one-row requests is one task, not a hundred queue
  // hand-offs between the workers.
  std::vector<Task> tasks;
  bool open = false;
  int64_t elements = 0;
  for (int s = 0; s < static_cast<int>(batch->segments.size()); ++s) {
    const SoftmaxShape& shape = batch->segments[s].shape;
    if (shape.n == 0 || shape.rows() == 0) continue;
    for (int64_t row = 0; row < shape.rows();) {
      const int64_t take =
          std::min(shape.rows() - row, std::max<int64_t>(1, (target - elements) / shape.n));
      if (!open) {
        tasks.push_back(Task{job, s, row, s, row});
        open = true;
      }
      tasks.back().last_segment = s;
      tasks.back().last_row_end = row + take;
      elements += take * shape.n;
      row += take;
      if (elements >= target) {
        open = false;
        elements = 0;
      }
    }
  }
  job->batch = std::move(batch);
  job->done = std::move(done);
  if (tasks.empty()) {
    Done finish = std::move(job->done);
    finish(std::move(job->batch), BatchResult());
    return;
  }
  job->remaining.store(static_cast<int64_t>(tasks.size()));
  absl::MutexLock lock(&mu_);
  for (auto& task : tasks) tasks_.push_back(std::move(task));
  // One wake-up per task, not one per thread: a woken thread that finds the
  // queue empty has only cost its wake-up, but a single-task batch woke
  // every thread of the pool.
  size_t wake = std::min(tasks.size(), threads_.size());
  if (worker_of == this) --wake;
  for (size_t i = 0; i < wake; ++i) cv_.Signal();
}

void CpuBackend::WorkerLoop() {
  worker_of = this;
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      while (tasks_.empty() && !stopping_) cv_.Wait(&mu_);
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    for (int s = task.first_segment; s <= task.last_segment; ++s) {
      const Segment& segment = task.job->batch->segments[s];
      const int64_t begin = s == task.first_segment ? task.first_row : 0;
      const int64_t end = s == task.last_segment ? task.last_row_end : segment.shape.rows();
      if (segment.shape.n == 0 || begin >= end) continue;
      CpuSoftmaxRows(segment.input, segment.output, segment.dtype, segment.shape,
                     segment.options, begin, end);
    }
    if (task.job->remaining.fetch_sub(1) == 1) {
      const auto elapsed = std::chrono::steady_clock::now() - task.job->start;
      BatchResult result;
      result.compute_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
      // The CPU computes in place of a kernel: its bandwidth is over compute time.
      result.kernel_ns = result.compute_ns;
      result.kernel_bytes = 2 * task.job->batch->bytes;
      Done finish = std::move(task.job->done);
      finish(std::move(task.job->batch), std::move(result));
    }
  }
}

}  // namespace softmax::server
