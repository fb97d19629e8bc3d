#include "server/scheduling/admission.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/scheduling/batcher.h"

namespace softmax::server {

Admission::Admission(const AdmissionOptions& options, Batcher* batcher)
    : options_(options), batcher_(batcher) {}

Admission::Ticket Admission::Enter() {
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  return Ticket(this);
}

void Admission::Refuse(const absl::Status& status, Responder responder) {
  if (responder.hold_refusals) {
    // (Held only once HoldRefusals has been called, after StartDraining.)
    auto done = std::make_shared<Responder>(std::move(responder));
    if (HoldRefusal([done, status] { done->done(status, RequestTiming{}); })) return;
    done->done(status, RequestTiming{});
    return;
  }
  responder.done(status, RequestTiming{});
}

void Admission::Submit(InferenceRequest request, Responder responder,
                       std::shared_ptr<const void>* held) {
  if (!request.tensor.valid) {
    // A front-end that skipped validation: its fault, not the caller's.
    responder.done(absl::InternalError("request submitted without validation"), RequestTiming{});
    return;
  }
  if (draining_.load(std::memory_order_relaxed)) {
    Refuse(absl::UnavailableError("server is shutting down; retry on another replica"),
           std::move(responder));
    return;
  }
  const InputTensor& input = request.input;
  const OutputSink& output = request.output;
  const int64_t bytes = request.tensor.bytes;
  std::shared_ptr<const void> lease;
  bool reserved_into_held = false;
  if (options_.budget != nullptr && (held == nullptr || *held == nullptr)) {
    // The input and the output, each unless it lies in a caller's region.
    const int64_t held_bytes =
        (input.external ? 0 : bytes) + (output.region != nullptr ? 0 : bytes);
    lease = options_.budget->TryReserve(held_bytes);
    if (lease == nullptr) {
      Refuse(absl::UnavailableError(absl::StrCat(
                 "server memory budget spent: requests hold ", options_.budget->held(),
                 " bytes and this one needs ", held_bytes, " more (--max_held_bytes=",
                 options_.budget->limit(), "); retry with backoff")),
             std::move(responder));
      return;
    }
    if (held != nullptr) {
      *held = std::move(lease);
      reserved_into_held = true;
    }
  }

  if (options_.echo || batcher_ == nullptr) {
    // (No GPU here, so neither side is in device memory.)
    const size_t size = static_cast<size_t>(bytes);
    if (output.region != nullptr) {
      std::memmove(output.region, input.data, size);
    } else if (input.buffer != nullptr && input.buffer->size() == size &&
               input.buffer->data() == input.data) {
      // Moved, not copied: the input is not read again.
      output.buffer->swap(*input.buffer);
    } else {
      output.buffer->assign(input.data, size);
    }
    responder.done(absl::OkStatus(), RequestTiming{});
    return;
  }

  auto item = std::make_unique<WorkItem>();
  item->segment.input = input.data;
  item->segment.bytes = bytes;
  item->segment.dtype = request.dtype;
  item->segment.shape = request.tensor.shape;
  item->segment.options = request.tensor.options;
  item->output = output.buffer;
  item->input_buffer = input.buffer_is_movable ? input.buffer : nullptr;
  item->output_view = output.view;
  if (input.external) {
    item->input_buffer = nullptr;
    item->segment.input_memory = input.memory;
    item->segment.input_device = input.device;
  }
  item->segment.staged = std::move(request.input.staged);
  if (output.region != nullptr) {
    item->fixed_output = output.region;
    item->output_view = nullptr;
    item->segment.output_memory = output.region_memory;
    item->segment.output_device = output.region_device;
  }
  item->deadline = request.deadline;
  item->is_cancelled = std::move(request.is_cancelled);
  item->done = std::move(responder.done);
  item->lease = std::move(lease);  // given back once the request is answered
  absl::Status enqueued = batcher_->Enqueue(std::move(item));
  if (enqueued.ok()) return;
  // Still ours: nothing of it is kept, and its responder answers the refusal.
  responder.done = std::move(item->done);
  item.reset();
  if (reserved_into_held) held->reset();
  Refuse(enqueued, std::move(responder));
}

StagingBuffer Admission::AllocateStaging(int64_t bytes) const {
  return options_.echo || batcher_ == nullptr ? StagingBuffer{}
                                              : batcher_->AllocateStaging(bytes);
}

bool Admission::RegisterStream(Stream* stream) {
  absl::MutexLock lock(&streams_mu_);
  if (draining_.load()) return false;
  streams_.insert(stream);
  return true;
}

void Admission::UnregisterStream(Stream* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void Admission::StartDraining() {
  std::vector<Stream*> idle;
  {
    absl::MutexLock lock(&streams_mu_);
    draining_.store(true);
    for (Stream* stream : streams_) {
      if (stream->BeginDrain()) idle.push_back(stream);
    }
  }
  // Outside streams_mu_: a finished stream's unregistering takes it. The
  // streams cannot be gone yet: only FinishDrained leads to their end.
  for (Stream* stream : idle) stream->FinishDrained();
}

void Admission::HoldRefusals() {
  absl::MutexLock lock(&streams_mu_);
  holding_ = true;
}

bool Admission::HoldRefusal(std::function<void()> release) {
  absl::MutexLock lock(&streams_mu_);
  if (!holding_) return false;
  held_.push_back(std::move(release));
  return true;
}

void Admission::ReleaseHeldCalls() {
  std::vector<std::function<void()>> held;
  {
    absl::MutexLock lock(&streams_mu_);
    holding_ = false;
    held.swap(held_);
  }
  for (std::function<void()>& release : held) release();
}

bool Admission::WaitForInFlight(absl::Time deadline) const {
  // Polled: it runs once, at shutdown, and keeps the count a lone atomic
  // that no request has to lock.
  constexpr absl::Duration kPoll = absl::Milliseconds(1);
  while (in_flight() != 0) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(kPoll, deadline - now));
  }
  return true;
}

}  // namespace softmax::server
