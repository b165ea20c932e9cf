// A finished request's ledger on the timeline (telemetry/trace.h): one track per request in process
// "requests", a span over its end-to-end time (first byte -> last byte) named after its API, with its ledger
// stages nested inside, back to back in the vocabulary's order (telemetry/ledger.h). The stages are where
// the time went, not when: a generation request's prefill, decode, schedule and interleave alternate step by
// step, and are shown as one block each. Called where the ledger goes to /metrics, so a trace's requests
// are the ones the metrics counted; records only while a trace is on.
#pragma once

#include <string_view>

#include "base/clock.h"
#include "telemetry/ledger.h"

namespace stoke {

struct LedgerTraceInfo {
  std::string_view model;
  std::string_view api;  // "chat" | "completion" | "embeddings" | "kserve_http" | "kserve_grpc"
  std::string_view id;
  Nanos end = 0;  // monotonic: the last byte written (the span starts at end - ledger.e2e)
};

void TraceLedger(const LedgerTraceInfo& info, const Ledger& ledger);

}  // namespace stoke
