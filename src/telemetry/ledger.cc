#include "telemetry/ledger.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <iterator>

namespace stoke {
namespace {

using S = LedgerStage;
constexpr LedgerStage kClassicStages[] = {S::kRecv, S::kQueue,       S::kPreprocess, S::kH2d,  S::kCompute,
                                          S::kD2h,  S::kPostprocess, S::kSend,       S::kOther};
constexpr LedgerStage kGenerationStages[] = {S::kRecv,   S::kQueue,    S::kPreprocess, S::kPrefill,
                                             S::kDecode, S::kSchedule, S::kInterleave, S::kPostprocess,
                                             S::kSend,   S::kOther};

double Ms(Nanos ns) {
  return static_cast<double>(ns) * 1e-6;
}

}  // namespace

const char* LedgerStageName(LedgerStage s) {
  static const char* const kNames[kNumLedgerStages] = {
      "recv", "queue",   "preprocess", "h2d",      "compute",    "d2h",  "postprocess",
      "send", "prefill", "decode",     "schedule", "interleave", "other"};
  return kNames[static_cast<int>(s)];
}

std::span<const LedgerStage> LedgerStages(LedgerKind kind) {
  if (kind == LedgerKind::kGeneration) return kGenerationStages;
  return kClassicStages;
}

Nanos Ledger::Attributed() const {
  Nanos sum = 0;
  for (int i = 0; i < kNumLedgerStages; ++i) {
    if (i != static_cast<int>(LedgerStage::kOther)) sum += ns[i];
  }
  return sum;
}

void Ledger::Close(Nanos end_to_end) {
  e2e = end_to_end;
  (*this)[LedgerStage::kOther] = e2e - Attributed();
}

std::string LedgerHeaderValue(const Ledger& l) {
  std::string out;
  for (LedgerStage s : LedgerStages(l.kind)) {
    fmt::format_to(std::back_inserter(out), "{}={:.3f};", LedgerStageName(s), Ms(l[s]));
  }
  fmt::format_to(std::back_inserter(out), "e2e={:.3f}", Ms(l.e2e));
  return out;
}

std::string LedgerJson(const Ledger& l) {
  std::string out = fmt::format(R"({{"e2e_ms":{:.3f},"stages_ms":{{)", Ms(l.e2e));
  bool first = true;
  for (LedgerStage s : LedgerStages(l.kind)) {
    fmt::format_to(std::back_inserter(out), R"({}"{}":{:.3f})", first ? "" : ",", LedgerStageName(s),
                   Ms(l[s]));
    first = false;
  }
  out += "}}";
  return out;
}

bool LedgerRequested(std::string_view v) {
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

}  // namespace stoke
