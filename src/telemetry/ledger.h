// The per-request time ledger (design.md §4): one stage vocabulary for every front end and model kind, and
// the arithmetic that makes the stages add up to the request's end-to-end time (first byte received -> last
// byte written).
//
//   stage        classic request (KServe, /v1/embeddings)        generation request (/v1/completions, chat)
//   recv         first byte -> request parsed                     first byte -> request parsed
//   queue        queued -> its batch starts executing             submitted -> first step that computes it
//   preprocess   tokenise/decode inputs + assemble the batch      chat template + tokenize + validation
//   h2d, d2h     copies to and from the device                    (inside prefill/decode on a GPU)
//   compute      the model's execution                            0: split into prefill and decode
//   prefill      -                                                model steps that computed its prompt
//   decode       -                                                model steps that computed its next token
//   schedule     -                                                per-step host time: planning, block
//                                                                  tables, step inputs, step bookkeeping
//   interleave   -                                                sat while the loop did others' work:
//                                                                  their sampling, steps without it,
//                                                                  between steps (inbox, admission)
//   postprocess  split/format outputs                             its sampling, detokenising, stop checks
//   send         outputs ready -> last byte written               last token -> last byte written
//   other        e2e minus the rest (what no stage covers; small)
//
// A Ledger holds nanoseconds per stage; Close(e2e) sets `other` so that the stages sum to e2e exactly.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "base/clock.h"

namespace stoke {

enum class LedgerStage : uint8_t {
  kRecv,
  kQueue,
  kPreprocess,
  kH2d,
  kCompute,
  kD2h,
  kPostprocess,
  kSend,
  kPrefill,     // generation: compute split
  kDecode,      // generation: compute split
  kSchedule,    // generation: host time per step
  kInterleave,  // generation: waiting on others' work between its own steps
  kOther,       // e2e minus every other stage
};
inline constexpr int kNumLedgerStages = 13;
const char* LedgerStageName(LedgerStage s);

// What kind of request the ledger describes: it decides which stages are shown (the others stay 0).
enum class LedgerKind : uint8_t { kClassic, kGeneration };
// Stages shown for a kind, in display order (other last).
std::span<const LedgerStage> LedgerStages(LedgerKind kind);

struct Ledger {
  LedgerKind kind = LedgerKind::kClassic;
  std::array<Nanos, kNumLedgerStages> ns{};  // per stage
  Nanos e2e = 0;                             // first byte -> last byte (or -> the moment it was closed)

  Nanos& operator[](LedgerStage s) { return ns[static_cast<int>(s)]; }
  Nanos operator[](LedgerStage s) const { return ns[static_cast<int>(s)]; }
  // Sum of every stage but `other`.
  Nanos Attributed() const;
  // Sets e2e and other = e2e - Attributed(): afterwards the stages sum to e2e exactly.
  void Close(Nanos end_to_end);
};

// "recv=0.012;queue=0.300;...;other=0.001;e2e=512.300": milliseconds with 3 decimals, the kind's stages
// (the X-Stoke-Ledger response header).
std::string LedgerHeaderValue(const Ledger& l);
// {"e2e_ms":512.3,"stages_ms":{"recv":0.012,...,"other":0.001}}: the kind's stages, ms with 3 decimals.
std::string LedgerJson(const Ledger& l);

// The request header (and gRPC metadata key) that asks for the ledger, and its response header.
inline constexpr const char* kLedgerHeader = "x-stoke-ledger";
inline constexpr const char* kLedgerResponseHeader = "X-Stoke-Ledger";
// True when a request header value asks for the ledger ("1", "true", "yes", "on").
bool LedgerRequested(std::string_view header_value);

}  // namespace stoke
