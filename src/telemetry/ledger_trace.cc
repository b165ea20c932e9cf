#include "telemetry/ledger_trace.h"

#include <vector>

#include "telemetry/trace.h"

namespace stoke {

void TraceLedger(const LedgerTraceInfo& info, const Ledger& ledger) {
  TraceRecorder& tr = TraceRecorder::Global();
  if (!tr.on()) return;
  std::vector<TraceStage> stages;
  for (LedgerStage s : LedgerStages(ledger.kind)) stages.push_back({LedgerStageName(s), ledger[s]});
  tr.Request(info.id, info.api, info.end - ledger.e2e, stages,
             {{"model", std::string(info.model)},
              {"api", std::string(info.api)},
              {"e2e_us", static_cast<double>(ledger.e2e) * 1e-3}});
}

}  // namespace stoke
