#include "server/cpu/cpu_backend.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "kernels/cpu_softmax.h"
#include "common/thread_name.h"

namespace softmax::server {
struct CpuBackend::Job {
  Batch* batch = nullptr;
  std::atomic<int64_t> remaining{0};
  absl::Notification finished;  // every task ran
};

namespace {
// The cores this process may run on: its CPU affinity (a container's cpuset,
// taskset), else every core of the machine; at least one.
int UsableCores() {
  cpu_set_t cores;
  CPU_ZERO(&cores);
  if (sched_getaffinity(0, sizeof(cores), &cores) == 0 && CPU_COUNT(&cores) > 0) {
    return CPU_COUNT(&cores);
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}
}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& options) : options_(options) {
  const int count = options.threads > 0 ? options.threads : UsableCores();
  threads_count_ = count;
  // The slot's own thread is the last of the `count`.
  helpers_.reserve(count - 1);
  for (int i = 0; i + 1 < count; ++i) {
    helpers_.emplace_back([this, i] {
      NameThisThread(absl::StrCat("sm-cpu-", i));
      HelperLoop();
    });
  }
}

CpuBackend::~CpuBackend() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  for (auto& thread : helpers_) thread.join();
}

std::string CpuBackend::Describe() const { return absl::StrCat("cpu threads=", threads_count_); }

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
  info.multiprocessors = threads_count_;
  return info;
}

namespace {
bool OnHost(const Segment& segment) {
  return segment.input_memory != MemoryKind::kDevice &&
         segment.output_memory != MemoryKind::kDevice;
}
}  // namespace

BatchResult CpuBackend::Execute(int slot, Batch& batch) {
  const auto start = std::chrono::steady_clock::now();
  BatchResult result;
  if (batch.submitted != std::chrono::steady_clock::time_point{}) {
    result.dispatch_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(start - batch.submitted).count();
  }
  auto job = std::make_shared<Job>();
  job->batch = &batch;
  // GPU memory is out of the CPU's reach (RunTask skips it).
  for (size_t s = 0; s < batch.segments.size(); ++s) {
    if (!OnHost(batch.segments[s])) {
      result.segment_status.resize(batch.segments.size());
      result.segment_status[s] = absl::FailedPreconditionError(
          "the tensor is in GPU memory and this server computes on the CPU");
    }
  }

  int64_t total_elements = 0;
  for (const Segment& segment : batch.segments) total_elements += segment.shape.elements();
  const int64_t per_thread_share = total_elements / (4 * static_cast<int64_t>(threads_count_) + 1);
  const int64_t target = std::max(options_.min_task_elements, per_thread_share);

  // Tasks of about `target` elements each, cut across segment boundaries:
  // a batch of a hundred one-row requests is one task, not a hundred queue
  // hand-offs between the threads.
  std::vector<Task> tasks;
  bool open = false;
  int64_t elements = 0;
  for (int s = 0; s < static_cast<int>(batch.segments.size()); ++s) {
    const SoftmaxShape& shape = batch.segments[s].shape;
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
  if (!tasks.empty()) {
    job->remaining.store(static_cast<int64_t>(tasks.size()));
    {
      absl::MutexLock lock(&mu_);
      for (auto& task : tasks) tasks_.push_back(std::move(task));
      // One wake-up per task beyond the one this thread runs, not one per
      // thread: a single-task batch would otherwise wake the whole pool.
      const size_t wake = std::min(tasks.size() - 1, helpers_.size());
      for (size_t i = 0; i < wake; ++i) cv_.Signal();
    }
    // This thread works through the queue too, then waits for the helpers'
    // last tasks.
    while (RunOneTask()) {
    }
    job->finished.WaitForNotification();
  }
  result.compute_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
  // The CPU computes in place of a kernel: its bandwidth is over compute time.
  result.kernel_ns = result.compute_ns;
  // Each input read once per pass; written: whole outputs and top Ks.
  for (const Segment& segment : batch.segments) {
    result.kernel_bytes += segment.bytes;
    if (segment.full_output) result.kernel_bytes += segment.bytes;
    if (segment.top_k > 0) {
      result.kernel_bytes += TopKBytes(segment.dtype, segment.shape.rows(), segment.top_k);
    }
  }
  return result;
}

bool CpuBackend::RunOneTask() {
  Task task;
  {
    absl::MutexLock lock(&mu_);
    if (tasks_.empty()) return false;
    task = std::move(tasks_.front());
    tasks_.pop_front();
  }
  RunTask(task);
  return true;
}

void CpuBackend::RunTask(const Task& task) {
  for (int s = task.first_segment; s <= task.last_segment; ++s) {
    const Segment& segment = task.job->batch->segments[s];
    if (!OnHost(segment)) continue;
    const int64_t begin = s == task.first_segment ? task.first_row : 0;
    const int64_t end = s == task.last_segment ? task.last_row_end : segment.shape.rows();
    if (segment.shape.n == 0 || begin >= end) continue;
    // The top K first: the output may be the input itself.
    if (segment.top_k > 0) {
      CpuSoftmaxTopKRows(segment.input, segment.dtype, segment.shape, segment.options,
                         segment.top_k, segment.top_k_values, segment.top_k_indices, begin, end);
    }
    if (segment.full_output) {
      CpuSoftmaxRows(segment.input, segment.output, segment.dtype, segment.shape,
                     segment.options, begin, end);
    }
  }
  if (task.job->remaining.fetch_sub(1) == 1) task.job->finished.Notify();
}

void CpuBackend::HelperLoop() {
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      while (tasks_.empty() && !stopping_) cv_.Wait(&mu_);
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    RunTask(task);
  }
}

}  // namespace softmax::server
