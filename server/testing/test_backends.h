// Fakes and builders shared by the server's tests: a configurable fake
// Backend (records what it runs and where, optionally holds each batch until
// the test releases it), test tensors and the batches made of them, WorkItems
// for the batcher, a recording BatcherObserver, and waits on conditions.
//
// Header-only; for tests (it uses GoogleTest to report misuse).
#ifndef SOFTMAX_SERVER_TESTING_TEST_BACKENDS_H_
#define SOFTMAX_SERVER_TESTING_TEST_BACKENDS_H_

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"
#include "server/scheduling/backend.h"
#include "server/scheduling/batcher.h"

namespace softmax::server::testing {

// Generous: on a loaded machine a wait for something that should happen
// promptly must not fail because a thread was descheduled for a while.
inline constexpr absl::Duration kWait = absl::Seconds(20);

// Polls `condition` until it holds or `timeout` passes; true when it held.
inline bool Await(const std::function<bool()>& condition, absl::Duration timeout = kWait) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
  return true;
}

// What the fake backends compute: each segment's output is its input (none
// for a segment without full_output).
inline void CopyInputsToOutputs(const Batch& batch) {
  for (const Segment& s : batch.segments) {
    // In place (output == input) the output already holds the input.
    if (s.bytes > 0 && s.output != nullptr && s.output != s.input) {
      std::memcpy(s.output, s.input, static_cast<size_t>(s.bytes));
    }
  }
}

// Each output byte is its input byte complemented (also in place): unlike a
// copy, an output computed in place is told apart from one never computed.
inline void ComplementInputsIntoOutputs(const Batch& batch) {
  for (const Segment& s : batch.segments) {
    if (s.output == nullptr) continue;  // no full_output
    const char* in = static_cast<const char*>(s.input);
    char* out = static_cast<char*>(s.output);
    for (int64_t i = 0; i < s.bytes; ++i) out[i] = static_cast<char>(~in[i]);
  }
}

struct FakeBackendOptions {
  std::string name = "fake";
  int slots = 1;
  bool computes_in_place = false;
  // Execute blocks until the test calls ReleaseOne (or kWait passes: then
  // the test fails and the batch fails INTERNAL, so that nothing hangs).
  bool hold = false;
  // StageInput copies the input into a buffer of the backend's own.
  bool stage_inputs = false;
  // What Execute computes; default: CopyInputsToOutputs and a result with
  // compute_ns 1234, kernel_ns 1000 and dispatch_ns from batch.submitted.
  // Runs before a held batch waits for its release.
  std::function<void(int slot, Batch& batch, BatchResult& result)> compute;
};

// A Backend for tests: records each batch's segments, the thread and slot
// that ran it, and checks that each slot runs on one thread only, entered
// (EnterSlotThread) before its first Execute.
class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(FakeBackendOptions options = {}) : options_(std::move(options)) {}
  ~FakeBackend() override {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(running_, 0) << options_.name << ": destroyed while a batch runs";
  }

  std::string Describe() const override { return "fake " + options_.name; }
  std::string Name() const override { return options_.name; }
  int Slots() const override { return options_.slots; }
  bool ComputesInPlace() const override { return options_.computes_in_place; }

  void EnterSlotThread(int slot) override {
    absl::MutexLock lock(&mu_);
    auto entered = slot_threads_.find(slot);
    // A slot belongs to one thread (RunOnSlot may enter it again from it).
    if (entered != slot_threads_.end() && entered->second != std::this_thread::get_id()) {
      ++violations_;
    }
    slot_threads_[slot] = std::this_thread::get_id();
  }

  BatchResult Execute(int slot, Batch& batch) override {
    BatchResult result;
    result.compute_ns = 1234;
    result.kernel_ns = 1000;
    // What a backend measures: the batcher stamped when the batch was ready.
    if (batch.submitted != std::chrono::steady_clock::time_point{}) {
      result.dispatch_ns = std::max<int64_t>(
          1, std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now() - batch.submitted)
                 .count());
    }
    if (options_.compute) {
      options_.compute(slot, batch, result);
    } else {
      CopyInputsToOutputs(batch);
    }
    uint64_t ticket = 0;
    {
      absl::MutexLock lock(&mu_);
      auto entered = slot_threads_.find(slot);
      if (slot < 0 || slot >= std::max(1, options_.slots) || entered == slot_threads_.end() ||
          entered->second != std::this_thread::get_id()) {
        ++violations_;
      }
      if (++running_per_slot_[slot] > 1) ++violations_;  // two batches on one slot
      batches_.push_back(batch.segments);
      threads_.push_back(std::this_thread::get_id());
      slots_.push_back(slot);
      ++running_;
      max_running_ = std::max(max_running_, running_);
      ticket = next_ticket_++;
      if (options_.hold) held_.push_back(ticket);
    }
    if (options_.hold) {
      absl::MutexLock lock(&mu_);
      auto released = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return releases_.count(ticket) != 0;
      };
      if (mu_.AwaitWithTimeout(absl::Condition(&released), kWait)) {
        result.status = releases_[ticket];
        result.compute_ns = 555;
        releases_.erase(ticket);
      } else {
        ADD_FAILURE() << options_.name << ": a held batch was never released";
        held_.erase(std::find(held_.begin(), held_.end(), ticket));
        result.status = absl::InternalError("held batch never released");
      }
    }
    absl::MutexLock lock(&mu_);
    --running_;
    --running_per_slot_[slot];
    return result;
  }

  bool StageInput(Segment& segment) override {
    if (!options_.stage_inputs) return false;
    auto buffer = std::make_shared<std::string>(static_cast<const char*>(segment.input),
                                                static_cast<size_t>(segment.bytes));
    segment.input = buffer->data();
    segment.staged = buffer;
    staged_.fetch_add(1);
    return true;
  }

  DeviceInfo Device() const override {
    absl::MutexLock lock(&mu_);
    return device_;
  }
  std::vector<MemoryStats> Memory() const override {
    absl::MutexLock lock(&mu_);
    return memory_;
  }
  void set_device(DeviceInfo device) {
    absl::MutexLock lock(&mu_);
    device_ = std::move(device);
  }
  void set_memory(std::vector<MemoryStats> memory) {
    absl::MutexLock lock(&mu_);
    memory_ = std::move(memory);
  }

  // Lets the oldest held batch's Execute return, with `status`, on its slot
  // thread (which then answers the batch): this returns before that. Waits
  // (up to kWait) for a batch to be held.
  void ReleaseOne(absl::Status status = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&any), kWait)) {
      ADD_FAILURE() << options_.name << ": ReleaseOne with no batch held";
      return;
    }
    releases_[held_.front()] = std::move(status);
    held_.pop_front();
  }

  // Waits until `count` batches have started (Execute called); false on timeout.
  bool WaitForBatches(size_t count, absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return batches_.size() >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  // Waits until `count` batches are held, awaiting release; false on timeout.
  bool WaitForHeld(size_t count, absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return held_.size() >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  // Each batch's segments, in the order the batches started.
  std::vector<std::vector<Segment>> batches() const {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  size_t batch_count() const {
    absl::MutexLock lock(&mu_);
    return batches_.size();
  }
  // The thread and the slot each batch ran on, parallel to batches().
  std::vector<std::thread::id> threads() const {
    absl::MutexLock lock(&mu_);
    return threads_;
  }
  std::vector<int> slots() const {
    absl::MutexLock lock(&mu_);
    return slots_;
  }
  // The thread each slot entered on (EnterSlotThread).
  std::map<int, std::thread::id> slot_threads() const {
    absl::MutexLock lock(&mu_);
    return slot_threads_;
  }
  int held() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(held_.size());
  }
  int running() const {
    absl::MutexLock lock(&mu_);
    return running_;
  }
  int max_running() const {
    absl::MutexLock lock(&mu_);
    return max_running_;
  }
  // Broken slot rules: Execute on a slot not entered, on another thread
  // than the one that entered it, out of range, or twice at once; a slot
  // entered from two threads. 0 when the scheduler kept them.
  int violations() const {
    absl::MutexLock lock(&mu_);
    return violations_;
  }
  int staged() const { return staged_.load(); }

 private:
  const FakeBackendOptions options_;
  mutable absl::Mutex mu_;
  std::map<int, std::thread::id> slot_threads_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> running_per_slot_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<Segment>> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<int> slots_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> held_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Status> releases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int max_running_ ABSL_GUARDED_BY(mu_) = 0;
  int violations_ ABSL_GUARDED_BY(mu_) = 0;
  DeviceInfo device_ ABSL_GUARDED_BY(mu_);
  std::vector<MemoryStats> memory_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> staged_{0};
};

// Runs `batch` on `slot` of `backend` from the calling thread, as the
// scheduler's thread of that slot would: EnterSlotThread, then Execute.
inline BatchResult RunOnSlot(Backend& backend, Batch& batch, int slot = 0) {
  backend.EnterSlotThread(slot);
  return backend.Execute(slot, batch);
}

// A test tensor: its input bytes, an output buffer, and what to compute.
struct TestTensor {
  DType dtype = DType::kFloat32;
  SoftmaxShape shape;
  SoftmaxOptions options;
  std::string input;
  std::string output;
};

// A tensor of normal(0, scale) values, its output filled with `poison`
// bytes (0xff: NaN in every dtype; 0x7f: no softmax value either).
inline TestTensor RandomTensor(std::mt19937& rng, DType dtype, SoftmaxShape shape,
                               SoftmaxOptions options = SoftmaxOptions(), float scale = 3.0f,
                               char poison = '\xff') {
  TestTensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.options = options;
  t.input.resize(static_cast<size_t>(shape.elements() * ItemSize(dtype)));
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < shape.elements(); ++i) {
    StoreFromFloat(t.input.data(), dtype, i, normal(rng));
  }
  t.output.assign(t.input.size(), poison);
  return t;
}

// The segment of `t`: its input, and its output buffer.
inline Segment SegmentOf(TestTensor& t) {
  Segment s;
  s.input = t.input.data();
  s.output = t.output.data();
  s.bytes = static_cast<int64_t>(t.input.size());
  s.dtype = t.dtype;
  s.shape = t.shape;
  s.options = t.options;
  return s;
}

// One batch of `tensors`, one segment each, in order. `tensors` must
// outlive it and not be resized meanwhile.
inline Batch MakeBatch(std::vector<TestTensor>& tensors) {
  Batch batch;
  for (TestTensor& t : tensors) {
    batch.segments.push_back(SegmentOf(t));
    batch.rows += t.shape.rows();
    batch.bytes += batch.segments.back().bytes;
  }
  return batch;
}

// Where a segment's top K goes (Segment::top_k), for the backends' tests.
struct TestTopK {
  int64_t k = 0;
  std::string values;
  std::vector<int64_t> indices;
};

// Asks `segment` (of `tensor`) for its top K into `top_k`, sized and
// poisoned (0x7f bytes, -1 indices); without `full_output` the segment
// computes no whole output.
inline void AskTopK(const TestTensor& tensor, int64_t k, bool full_output, TestTopK* top_k,
                    Segment* segment) {
  const int64_t count = tensor.shape.rows() * k;
  top_k->k = k;
  top_k->values.assign(static_cast<size_t>(count * ItemSize(tensor.dtype)), '\x7f');
  top_k->indices.assign(static_cast<size_t>(count), -1);
  segment->top_k = k;
  segment->top_k_values = top_k->values.data();
  segment->top_k_indices = top_k->indices.data();
  segment->full_output = full_output;
  if (!full_output) segment->output = nullptr;
}

// One request through the batcher: its storage and outcome.
struct TestRequest {
  std::string input;
  std::string output;
  absl::Status status = absl::UnknownError("not completed");
  RequestTiming timing;
  std::thread::id answered_on;
  std::atomic<int> answers{0};
  absl::Notification done;

  bool Wait(absl::Duration timeout = kWait) {
    return done.WaitForNotificationWithTimeout(timeout);
  }
};

// A completion that records the outcome in `request` (and fails the test
// when called twice).
inline std::function<void(const absl::Status&, const RequestTiming&)> RecordAnswer(
    TestRequest* request) {
  return [request](const absl::Status& status, const RequestTiming& timing) {
    if (request->answers.fetch_add(1) != 0) {
      ADD_FAILURE() << "done called twice";
      return;
    }
    request->status = status;
    request->timing = timing;
    request->answered_on = std::this_thread::get_id();
    request->done.Notify();
  };
}

// A WorkItem of `rows` x `n` (a [rows, n, 1] tensor) whose input bytes are
// a pattern and whose `done` records the outcome in `request` (and fails
// the test when called twice).
inline std::unique_ptr<WorkItem> MakeItem(TestRequest* request, int64_t rows, int64_t n,
                                          DType dtype = DType::kFloat32,
                                          SoftmaxOptions options = SoftmaxOptions()) {
  request->input.assign(static_cast<size_t>(rows * n * ItemSize(dtype)), '\0');
  for (size_t i = 0; i < request->input.size(); ++i) {
    request->input[i] = static_cast<char>(i * 7 + 1);
  }
  auto item = std::make_unique<WorkItem>();
  item->segment.input = request->input.data();
  item->segment.bytes = static_cast<int64_t>(request->input.size());
  item->segment.dtype = dtype;
  item->segment.shape = SoftmaxShape{rows, n, 1};
  item->segment.options = options;
  item->output = &request->output;
  item->done = RecordAnswer(request);
  return item;
}

// Records every batcher event.
class RecordingObserver final : public BatcherObserver {
 public:
  void OnBatchCompleted(const BatchStats& stats) override {
    absl::MutexLock lock(&mu_);
    batches_.push_back(stats);
  }
  void OnRequestDropped(absl::StatusCode code) override {
    if (code == absl::StatusCode::kCancelled) ++cancelled;
    if (code == absl::StatusCode::kDeadlineExceeded) ++expired;
  }
  void OnRequestRejected() override { ++rejected; }

  std::vector<BatchStats> batches() const {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  std::atomic<int> cancelled{0}, expired{0}, rejected{0};

 private:
  mutable absl::Mutex mu_;
  std::vector<BatchStats> batches_ ABSL_GUARDED_BY(mu_);
};

// The threads of this process whose names start with `prefix` (e.g.
// "sm-fake-s", the scheduler's slot threads of backend "fake"), each with
// its state letter from /proc ('R' running, 'S' sleeping...).
inline std::vector<std::pair<std::string, char>> ThreadsNamed(const std::string& prefix) {
  std::vector<std::pair<std::string, char>> threads;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return threads;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + entry->d_name;
    std::string name;
    std::getline(std::ifstream(task + "/comm"), name);
    if (name.rfind(prefix, 0) != 0) continue;
    std::string stat;
    std::getline(std::ifstream(task + "/stat"), stat);
    // "tid (comm) S ...": the state follows the last ')'.
    const size_t close = stat.rfind(')');
    const char state =
        close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
    threads.emplace_back(name, state);
  }
  closedir(dir);
  return threads;
}

// Waits until no thread whose name starts with `prefix` is left. A joined
// thread can still show in /proc/self/task for a moment: the kernel wakes
// pthread_join from the thread's exit before it removes the task.
inline bool AwaitNoThreadsNamed(const std::string& prefix, absl::Duration timeout = kWait) {
  return Await([&] { return ThreadsNamed(prefix).empty(); }, timeout);
}

// Waits until exactly `count` threads whose names start with `prefix`
// exist and all of them sleep (none runs or polls): the scheduler's slot
// threads are then parked, waiting for a Notify (or held in a backend's
// Execute), so that which thread a Notify wakes is the scheduler's choice.
inline bool AwaitThreadsAsleep(const std::string& prefix, size_t count,
                               absl::Duration timeout = kWait) {
  return Await(
      [&] {
        const auto threads = ThreadsNamed(prefix);
        if (threads.size() != count) return false;
        for (const auto& thread : threads) {
          if (thread.second != 'S') return false;
        }
        return true;
      },
      timeout);
}

}  // namespace softmax::server::testing

#endif  // SOFTMAX_SERVER_TESTING_TEST_BACKENDS_H_
