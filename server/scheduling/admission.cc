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

void Admission::Submit(InferenceRequest request, Responder responder, Admitted* admitted) {
  if (!request.tensor.valid) {
    // A front-end that skipped validation: its fault, not the caller's.
    responder.done(absl::InternalError("request submitted without validation"), RequestTiming{});
    return;
  }
  // Kept by the caller (`admitted`) or, without one, until answered. Taken
  // before the drain is checked: a request that passes it is waited for.
  Admitted own;
  Admitted& keep = admitted != nullptr ? *admitted : own;
  Ticket ticket = keep.ticket ? Ticket() : Enter();
  if (draining_.load(std::memory_order_relaxed)) {
    ticket.Release();
    Refuse(absl::UnavailableError("server is shutting down; retry on another replica"),
           std::move(responder));
    return;
  }
  const InputTensor& input = request.input;
  const OutputSink& output = request.output;
  const int64_t bytes = request.tensor.bytes;
  // The backend computes the top K (Segment::top_k); echo answers with the
  // input, selected from it afterwards (server/rpc/dispatch.h).
  const bool backend_top_k = request.top_k > 0 && !options_.echo && batcher_ != nullptr;
  std::shared_ptr<const void> lease;
  if (options_.budget != nullptr && keep.budget == nullptr) {
    // The input and the output, each unless it lies in a caller's region.
    int64_t output_bytes = output.region != nullptr ? 0 : bytes;
    if (backend_top_k) {
      output_bytes = (request.full_output ? output_bytes : 0) +
                     TopKBytes(request.dtype, request.tensor.shape.rows(), request.top_k);
    }
    const int64_t held_bytes = (input.external ? 0 : bytes) + output_bytes;
    absl::StatusOr<std::shared_ptr<const void>> reserved = Reserve(held_bytes);
    if (!reserved.ok()) {
      ticket.Release();
      Refuse(reserved.status(), std::move(responder));
      return;
    }
    lease = *std::move(reserved);
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
    if (admitted != nullptr) {
      if (ticket) keep.ticket = std::move(ticket);
      if (lease != nullptr) keep.budget = std::move(lease);
    }
    responder.done(absl::OkStatus(), RequestTiming{});
    return;  // (without `admitted`: the ticket and lease go now)
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
  if (backend_top_k) {
    item->segment.top_k = request.top_k;
    item->segment.full_output = request.full_output;
    item->top_k = output.top_k;
  }
  item->deadline = request.deadline;
  item->is_cancelled = std::move(request.is_cancelled);
  item->done = std::move(responder.done);
  // Given to the caller before the item can be answered (Enqueue may answer
  // it on another thread at once); taken back if the item is refused.
  const bool took_ticket = static_cast<bool>(ticket);
  const bool took_lease = lease != nullptr;
  if (admitted != nullptr) {
    if (took_ticket) keep.ticket = std::move(ticket);
    if (took_lease) keep.budget = std::move(lease);
  } else if (took_ticket || took_lease) {
    // Given back once the request is answered.
    auto kept = std::make_shared<Admitted>();
    kept->ticket = std::move(ticket);
    kept->budget = std::move(lease);
    item->lease = std::move(kept);
  }
  absl::Status enqueued = batcher_->Enqueue(std::move(item));
  if (enqueued.ok()) return;
  // Still ours: nothing of it is kept, and its responder answers the refusal.
  responder.done = std::move(item->done);
  item.reset();
  if (took_ticket) keep.ticket.Release();
  if (took_lease) keep.budget.reset();
  Refuse(enqueued, std::move(responder));
}

absl::StatusOr<std::shared_ptr<const void>> Admission::Reserve(int64_t bytes) {
  if (options_.budget == nullptr) return std::shared_ptr<const void>();
  std::shared_ptr<const void> lease = options_.budget->TryReserve(bytes);
  if (lease == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "server memory budget spent: requests hold ", options_.budget->held(),
        " bytes and this one needs ", bytes, " more (--max_held_bytes=",
        options_.budget->limit(), "); retry with backoff"));
  }
  return lease;
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
