#include "server/scheduling/admission.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace softmax::server {

Admission::Admission(const AdmissionOptions& options, Batcher* batcher)
    : options_(options), batcher_(batcher) {}

Admission::Ticket Admission::Enter() {
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  return Ticket(this);
}

absl::Status Admission::Admit(AdmissionRequest request, std::shared_ptr<const void>* held) {
  if (draining_.load(std::memory_order_relaxed)) {
    return absl::UnavailableError("server is shutting down; retry on another replica");
  }
  WorkItem& item = *request.item;
  std::shared_ptr<const void> lease;
  bool reserved_into_held = false;
  if (options_.budget != nullptr && (held == nullptr || *held == nullptr)) {
    lease = options_.budget->TryReserve(request.held_bytes);
    if (lease == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "server memory budget spent: requests hold ", options_.budget->held(),
          " bytes and this one needs ", request.held_bytes, " more (--max_held_bytes=",
          options_.budget->limit(), "); retry with backoff"));
    }
    if (held != nullptr) {
      *held = std::move(lease);
      reserved_into_held = true;
    }
  }

  if (options_.echo || batcher_ == nullptr) {
    // (No GPU here, so neither side is in device memory.)
    const size_t bytes = static_cast<size_t>(item.segment.bytes);
    if (item.fixed_output != nullptr) {
      std::memmove(item.fixed_output, item.segment.input, bytes);
    } else if (request.input_string != nullptr && request.input_string->size() == bytes &&
               request.input_string->data() == item.segment.input) {
      // Moved, not copied: the input is not read again.
      item.output->swap(*request.input_string);
    } else {
      item.output->assign(static_cast<const char*>(item.segment.input), bytes);
    }
    item.done(absl::OkStatus(), RequestTiming{});
    return absl::OkStatus();
  }

  item.lease = std::move(lease);  // given back once the request is answered
  absl::Status enqueued = batcher_->Enqueue(std::move(request.item));
  if (!enqueued.ok() && reserved_into_held) held->reset();
  return enqueued;
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
