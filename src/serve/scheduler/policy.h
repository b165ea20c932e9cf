// The scheduler's two policy decisions, kept apart from its mechanics so they can be read (and changed) in
// one place. docs/scheduling.md explains why these choices.
//
//   admission order   higher priority first; within a priority, first come first served (arrival order).
//                     A preempted sequence keeps its arrival number, so it goes back in front of everything
//                     of its priority that arrived after it.
//   preemption victim the running sequence that ranks last by the same order (lowest priority, then latest
//                     arrival), among those not yet scheduled in this step.
#pragma once

#include <cstdint>

namespace stoke {

// Where a sequence stands in line. `arrival` is a counter the scheduler assigns on Add (ties impossible).
struct SeqRank {
  int priority = 0;
  uint64_t arrival = 0;
};

// True when `a` should be served before `b`.
inline bool RanksBefore(const SeqRank& a, const SeqRank& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  return a.arrival < b.arrival;
}

}  // namespace stoke
