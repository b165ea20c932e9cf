// The doctor's rules: Signals -> Verdicts, a pure function (no I/O, no clock), tested in rules_test.cc.
//
//   rule                fires when (thresholds: signals.h Thresholds, defaults in docs/doctor.md)
//   kv_capacity_bound   KV usage >= kv_full and (preemptions > 0 or admission stopped on no_blocks)
//   host_bound          host stages >= host_share of service time and it matters (instances busy >=
//                       matters_busy; without busy time, the group >= matters_latency of latency); or
//                       recv+send >= io_share of latency and (>= io_min_s, or the sweep stalls < min_scaling)
//   copy_bound          h2d + d2h >= copy_share of service time, and it matters (as above)
//   launch_bound        GPU-Util or GR engine >= gpu_busy, SM active < sm_low, DRAM and tensor low
//   bandwidth_bound     DRAM active >= dram_high; or streaming (DRAM >= dram_streaming, tensor idle, SMs
//                       busy); or an LLM step memory-heavy by its model (at the device's rates bytes time >=
//                       step_memory_heavy x math time; without them < memory_heavy_flop_per_byte FLOPs per
//                       byte) with DRAM >= dram_streaming
//   compute_bound       tensor >= tensor_high or SM active >= sm_high (not for a memory-heavy LLM step,
//                       above); without GPU counters: instances
//                       saturated with device stages dominating the service time (lower confidence)
//   queue_bound         queue >= queue_share of latency while instances / GPU are not saturated
//   under_fed           only when nothing above fired: instances (or the GPU) busy < idle_busy, the queue
//                       < idle_queue_share (or < queue_share when batches close on the delay half-empty:
//                       lone requests waiting out the batching delay), and the sweep (if any) scaled
//                       >= min_scaling; with no request finished, only when neither the GPU nor (LLM) the
//                       engine thread was busy >= idle_busy (else the requests outlast the window); or an
//                       LLM stepping (busy >= idle_busy) with SM, DRAM and tensor below their ceilings, KV
//                       < kv_full and waiting < max(1, 5 % of running): the clients' concurrency sets the
//                       batch
//   throttled           power/thermal violation time >= throttle_share of the window (or, without the
//                       counters, a power/thermal clock reason in >= reason_share of the samples)
//   none                nothing above fired
// The GPU rules (launch, bandwidth, compute) need the device stages to dominate the service time (or no
// ledger at all). Verdicts come out in that priority order; throttled goes after the main verdict
// (report it, don't tune against it); `none` only when the list would be empty.
#pragma once

#include <vector>

#include "tools/doctor/signals.h"

namespace stoke::doctor {

std::vector<Verdict> Diagnose(const Signals& s, const Thresholds& t = {});

}  // namespace stoke::doctor
