// Tests of the bookkeeping that resends what a load stream left unanswered.
#include "client/load/stream_ledger.h"

#include <vector>

#include "gtest/gtest.h"

namespace softmax::client {
namespace {

// Requests told apart by their payload pointer: the payloads themselves are
// never read here.
std::vector<LoadPayload> Payloads(int n) { return std::vector<LoadPayload>(n); }

StreamRequest RequestFor(const LoadPayload& payload) { return StreamRequest{&payload, {}, true}; }

// A ledger with a request for each of `payloads` queued, in their order,
// and the first `written` of them taken, as a stream writes them.
StreamLedger QueuedLedger(const std::vector<LoadPayload>& payloads, int written = 0) {
  StreamLedger ledger;
  for (const LoadPayload& payload : payloads) ledger.Queue(RequestFor(payload));
  StreamRequest request;
  for (int i = 0; i < written; ++i) ledger.TakeNext(&request);
  return ledger;
}

TEST(StreamLedgerTest, WritesInQueueOrderUnderIdsNeverReused) {
  const std::vector<LoadPayload> payloads = Payloads(3);
  StreamLedger ledger = QueuedLedger(payloads);
  StreamRequest request;
  EXPECT_EQ(ledger.TakeNext(&request), 0u);
  EXPECT_EQ(request.payload, &payloads[0]);
  EXPECT_EQ(ledger.TakeNext(&request), 1u);
  EXPECT_EQ(request.payload, &payloads[1]);
  EXPECT_EQ(ledger.in_flight(), 2u);
  EXPECT_EQ(ledger.queued(), 1u);
  ASSERT_NE(ledger.Find(1), nullptr);
  EXPECT_EQ(ledger.Find(1)->payload, &payloads[1]);
  EXPECT_EQ(ledger.Find(2), nullptr);  // never written
}

TEST(StreamLedgerTest, AnIdIsAnsweredOnce) {
  const std::vector<LoadPayload> payloads = Payloads(1);
  StreamLedger ledger;
  ledger.Queue(RequestFor(payloads[0]));
  StreamRequest request;
  const uint64_t id = ledger.TakeNext(&request);
  StreamRequest answered;
  ASSERT_TRUE(ledger.Answer(id, &answered));
  EXPECT_EQ(answered.payload, &payloads[0]);
  StreamRequest again{};
  EXPECT_FALSE(ledger.Answer(id, &again));
  EXPECT_EQ(again.payload, nullptr);
  EXPECT_FALSE(ledger.Answer(id + 1, &again));
  EXPECT_TRUE(ledger.empty());
}

TEST(StreamLedgerTest, RequeueResendsExactlyTheUnansweredOldestFirst) {
  // Six written, 1 and 4 answered, two never written: the stream ends. The
  // next one writes 0, 2, 3, 5 (under new ids), then the two queued.
  const std::vector<LoadPayload> payloads = Payloads(8);
  StreamLedger ledger = QueuedLedger(payloads);
  StreamRequest request;
  for (int i = 0; i < 6; ++i) EXPECT_EQ(ledger.TakeNext(&request), static_cast<uint64_t>(i));
  ASSERT_TRUE(ledger.Answer(4, &request));
  ASSERT_TRUE(ledger.Answer(1, &request));

  EXPECT_EQ(ledger.RequeueInFlight(), 4);
  EXPECT_EQ(ledger.in_flight(), 0u);
  EXPECT_EQ(ledger.queued(), 6u);
  // An answer to an id of the stream that ended is nobody's now.
  EXPECT_FALSE(ledger.Answer(0, &request));
  EXPECT_EQ(ledger.Find(5), nullptr);

  std::vector<const LoadPayload*> written;
  std::vector<uint64_t> ids;
  while (ledger.HasQueued()) {
    ids.push_back(ledger.TakeNext(&request));
    written.push_back(request.payload);
  }
  EXPECT_EQ(written, (std::vector<const LoadPayload*>{&payloads[0], &payloads[2], &payloads[3],
                                                      &payloads[5], &payloads[6], &payloads[7]}));
  EXPECT_EQ(ids, (std::vector<uint64_t>{6, 7, 8, 9, 10, 11}));
  for (uint64_t id : ids) ASSERT_TRUE(ledger.Answer(id, &request));
  EXPECT_TRUE(ledger.empty());
  EXPECT_EQ(ledger.RequeueInFlight(), 0);
}

TEST(StreamLedgerTest, RequeuedTwiceStillOnce) {
  // A stream that ends again before writing what was put back: nothing is
  // put back twice.
  const std::vector<LoadPayload> payloads = Payloads(3);
  StreamLedger ledger = QueuedLedger(payloads, /*written=*/2);
  EXPECT_EQ(ledger.RequeueInFlight(), 2);
  EXPECT_EQ(ledger.RequeueInFlight(), 0);
  StreamRequest request;
  ledger.TakeNext(&request);
  EXPECT_EQ(request.payload, &payloads[0]);
  EXPECT_EQ(ledger.RequeueInFlight(), 1);
  EXPECT_EQ(ledger.queued(), 3u);
}

TEST(StreamLedgerTest, TakeAllEmptiesInFlightThenQueued) {
  const std::vector<LoadPayload> payloads = Payloads(4);
  StreamLedger ledger = QueuedLedger(payloads, /*written=*/2);
  StreamRequest request;
  ASSERT_TRUE(ledger.Answer(0, &request));
  const std::vector<StreamRequest> all = ledger.TakeAll();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].payload, &payloads[1]);
  EXPECT_EQ(all[1].payload, &payloads[2]);
  EXPECT_EQ(all[2].payload, &payloads[3]);
  EXPECT_TRUE(ledger.empty());
}

}  // namespace
}  // namespace softmax::client
