// Plain records the engine loop hands to telemetry: one per step, one snapshot of its counters. No
// dependencies beyond base, so the engine side can fill them without linking the metrics registry.
#pragma once

#include <cstdint>
#include <string>

#include "base/clock.h"
#include "telemetry/ledger.h"

namespace stoke {

// One iteration of the continuous-batching loop (filled on the engine thread, after the step ran).
struct StepRecord {
  Nanos start = 0;         // monotonic, when planning began
  Nanos duration = 0;      // plan + model step + sampling, ns
  int prefill_tokens = 0;  // prompt tokens computed this step (all sequences, chunked prefill included)
  int decode_tokens = 0;   // one per running sequence that decoded
  int num_running = 0;     // sequences in the running set after admission
  int num_waiting = 0;     // sequences left waiting
  int num_preempted = 0;   // sequences preempted (recompute) this step
  int kv_blocks_used = 0;
  int kv_blocks_free = 0;  // free, including cached blocks with no reference (evictable)
  // Why admission stopped: "token_budget" | "max_seqs" | "no_blocks" | "queue_empty" ("" = not recorded).
  std::string admission_stop;
  // The model step's device time from CUDA events (only while a trace is on, on a GPU backend; 0 = none) and
  // when the host saw the step finish (monotonic): the GPU was busy for about [device_end - device_ns,
  // device_end).
  Nanos device_ns = 0;
  Nanos device_end = 0;
  // Where `duration` went: inside DecoderModel::Step (on a GPU its host work, the launches and the wait for
  // the sampled ids or logits), the rest on the host (planning, inputs, host sampling, detokenising, stops).
  Nanos model_ns = 0;
  // Async output (--async-output on): host time the output thread spent on the previous step's tokens
  // (detokenising, stop strings, events) while this step's model ran: work taken off `duration` (0 = off).
  Nanos output_ns = 0;
  // What the step read and computed. Counted: KV positions attention read (each sequence's context once, as
  // the paged kernels read it once per group of query heads), (query, key) pairs, rows through the lm_head.
  int64_t kv_positions = 0;
  int prefill_cap = -1;  // the step-time target's cap on prefill tokens this step (-1: none)
  int64_t attention_pairs = 0;
  int64_t logit_rows = 0;
  // Modelled from the model's shape and storage (engine/model/step_costs.h; 0 when not known): weight and KV
  // bytes read, matmul and attention FLOPs. `stoke doctor` divides them by the device's rates.
  double weight_bytes = 0, kv_bytes = 0;
  double matmul_flops = 0, attention_flops = 0;
};

// Cumulative engine counters and current gauges, sampled when /metrics is scraped (any thread).
struct EngineSnapshot {
  int num_running = 0;
  int num_waiting = 0;
  int kv_blocks_used = 0;
  int kv_blocks_free = 0;
  int kv_blocks_total = 0;
  // Counted in tokens (vLLM's convention): queries = prompt tokens looked up, hits = served from the cache.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t prefix_cache_evictions = 0;  // blocks evicted from the cache (LRU) to make room
  int64_t num_preemptions = 0;
};

}  // namespace stoke
