// Scheduler tests simulate steps without a model. Each test comments its token timeline, one line per step:
//   step  what runs (p = prefill tokens, d = decode, * = the prefill chunk ends the prompt and samples;
//         a decode always samples)
// "A:p8" means sequence A computed 8 prompt tokens; "B:p5*" computed its last 5 and sampled a token.
#include "serve/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

namespace stoke {
namespace {

std::vector<int32_t> Tokens(int n, int32_t start) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// The "model" of these tests: sequence `id`'s n-th generated token is Gen(id, n), whatever the batch.
int32_t Gen(SeqId id, int n) {
  return 100000 + static_cast<int32_t>(id) * 1000 + n;
}

class Sim {
 public:
  Sim(SchedulerOptions opts, int num_blocks, int block_size = 4)
      : alloc_({.num_blocks = num_blocks, .block_size = block_size}), sched_(opts, &alloc_) {}

  void Add(char name, int prompt_len, int max_tokens, int priority = 0, int32_t first_token = -1) {
    const SeqId id = name;
    if (first_token < 0) first_token = name * 100;
    ASSERT_TRUE(sched_.Add(id, Tokens(prompt_len, first_token), priority).ok());
    max_tokens_[id] = max_tokens;
    prompts_[id] = Tokens(prompt_len, first_token);
  }

  // Runs one step; returns its timeline line, e.g. "A:d1 B:p4*".
  std::string Step() {
    last_ = sched_.Schedule();
    CheckPlan(last_);
    sched_.CompleteStep(last_);
    std::string line;
    for (const ScheduledSeq& s : last_.seqs) {
      if (!line.empty()) line += ' ';
      line += fmt::format("{}:{}{}{}", static_cast<char>(s.id), s.is_prefill ? 'p' : 'd', s.num_tokens,
                          s.is_prefill && s.sample ? "*" : "");
      if (!s.sample) continue;
      int& n = generated_[s.id];
      EXPECT_TRUE(sched_.AppendToken(s.id, Gen(s.id, n)).ok());
      if (++n == max_tokens_[s.id]) {
        finished_[s.id] = std::vector<int32_t>(sched_.Tokens(s.id).begin(), sched_.Tokens(s.id).end());
        sched_.Finish(s.id);
      }
    }
    Status st = alloc_.CheckInvariants();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return line;
  }

  std::vector<std::string> Run(int steps) {
    std::vector<std::string> lines;
    for (int i = 0; i < steps; ++i) lines.push_back(Step());
    return lines;
  }

  // What a sequence must end up with no matter how it was batched, chunked or preempted.
  std::vector<int32_t> Expected(SeqId id) {
    std::vector<int32_t> v = prompts_[id];
    for (int n = 0; n < max_tokens_[id]; ++n) v.push_back(Gen(id, n));
    return v;
  }

  Scheduler& sched() { return sched_; }
  BlockAllocator& alloc() { return alloc_; }
  const StepPlan& last() const { return last_; }
  std::map<SeqId, std::vector<int32_t>>& finished() { return finished_; }

 private:
  void CheckPlan(const StepPlan& plan) {
    EXPECT_LE(plan.num_tokens(), sched_.options().max_num_batched_tokens);
    EXPECT_LE(static_cast<int>(plan.seqs.size()), sched_.options().max_num_seqs);
    std::set<SeqId> seen;
    bool prefill_seen = false;
    for (const ScheduledSeq& s : plan.seqs) {
      EXPECT_TRUE(seen.insert(s.id).second) << "scheduled twice: " << s.id;
      EXPECT_GT(s.num_tokens, 0);
      // Decodes come before prefill chunks.
      if (s.is_prefill) prefill_seen = true;
      EXPECT_FALSE(!s.is_prefill && prefill_seen) << "decode after a prefill chunk";
      const int covered = static_cast<int>(sched_.BlockTable(s.id).size()) * alloc_.block_size();
      EXPECT_GE(covered, s.start_pos + s.num_tokens) << "block table too short for " << s.id;
      EXPECT_LE(s.start_pos + s.num_tokens, static_cast<int>(sched_.Tokens(s.id).size()));
    }
  }

  BlockAllocator alloc_;
  Scheduler sched_;
  StepPlan last_;
  std::map<SeqId, int> max_tokens_;
  std::map<SeqId, int> generated_;
  std::map<SeqId, std::vector<int32_t>> prompts_;
  std::map<SeqId, std::vector<int32_t>> finished_;
};

SchedulerOptions Opts(int budget, int max_seqs = 64, bool chunked = true) {
  SchedulerOptions o;
  o.max_num_batched_tokens = budget;
  o.max_num_seqs = max_seqs;
  o.enable_chunked_prefill = chunked;
  o.watermark_blocks = 0;
  return o;
}

TEST(SchedulerTest, AdmitsChunksAndDecodes) {
  // budget 8; A: prompt 10, 3 tokens; B: prompt 5, 2 tokens.
  //   1  A:p8                 budget spent, B waits (token_budget)
  //   2  A:p2* B:p5*          A's last chunk and B's whole prompt share the step
  //   3  A:d1 B:d1            B done (2 tokens)
  //   4  A:d1                 A done (3 tokens)
  Sim sim(Opts(8), /*num_blocks=*/32);
  sim.Add('A', 10, 3);
  sim.Add('B', 5, 2);
  EXPECT_EQ(sim.Step(), "A:p8");
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kTokenBudget);
  EXPECT_EQ(sim.last().num_waiting, 1);
  EXPECT_EQ(sim.Step(), "A:p2* B:p5*");
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kQueueEmpty);
  EXPECT_EQ(sim.last().num_prefill_tokens, 7);
  EXPECT_EQ(sim.Step(), "A:d1 B:d1");
  EXPECT_EQ(sim.last().num_decode_tokens, 2);
  EXPECT_EQ(sim.Step(), "A:d1");
  EXPECT_EQ(sim.Step(), "");
  EXPECT_FALSE(sim.sched().HasWork());
  EXPECT_EQ(sim.finished()['A'], sim.Expected('A'));
  EXPECT_EQ(sim.finished()['B'], sim.Expected('B'));
  EXPECT_EQ(sim.alloc().NumUsedBlocks(), 0);
}

TEST(SchedulerTest, DecodesComeFirstAndPrefillTakesTheRestOfTheBudget) {
  // budget 6; A, B: prompt 2, 4 tokens; C arrives after step 1 with a 12-token prompt.
  //   1  A:p2* B:p2*
  //   2  A:d1 B:d1 C:p4       two decodes first, C gets the 4 left
  //   3  A:d1 B:d1 C:p4
  //   4  A:d1 B:d1 C:p4*      A, B done
  //   5  C:d1
  Sim sim(Opts(6), 32);
  sim.Add('A', 2, 4);
  sim.Add('B', 2, 4);
  EXPECT_EQ(sim.Step(), "A:p2* B:p2*");
  sim.Add('C', 12, 2);
  EXPECT_EQ(sim.Run(4),
            (std::vector<std::string>{"A:d1 B:d1 C:p4", "A:d1 B:d1 C:p4", "A:d1 B:d1 C:p4*", "C:d1"}));
  EXPECT_EQ(sim.finished()['C'], sim.Expected('C'));
}

TEST(SchedulerTest, PrefillRoomLimitsPrefillAfterTheDecodes) {
  // budget 16; the room asked after the decodes: 8 - 2 x decodes (in units where a prefill token costs 1 and
  // a KV position 0); A, B: prompt 2, 4 tokens; C: 12-token prompt arriving after step 1.
  //   1  A:p2* B:p2*          no decodes: room 8
  //   2  A:d1 B:d1 C:p4       two decodes (KV positions 3 + 3): room 4, though 14 of the budget are left
  //   3  A:d1 B:d1 C:p4
  //   4  A:d1 B:d1 C:p4*
  //   5  C:d1
  Sim sim(Opts(16), 32);
  std::vector<std::pair<int, int64_t>> asked;
  sim.sched().set_prefill_room([&](int decodes, int64_t kv) {
    asked.emplace_back(decodes, kv);
    return Scheduler::PrefillRoom{.seconds = 8.0 - 2 * decodes, .per_token = 1, .per_kv_position = 0};
  });
  sim.Add('A', 2, 4);
  sim.Add('B', 2, 4);
  EXPECT_EQ(sim.Step(), "A:p2* B:p2*");
  EXPECT_EQ(sim.last().prefill_cap, 8);
  sim.Add('C', 12, 2);
  EXPECT_EQ(sim.Step(), "A:d1 B:d1 C:p4");
  EXPECT_EQ(sim.last().prefill_cap, 4);
  EXPECT_EQ(sim.Run(3), (std::vector<std::string>{"A:d1 B:d1 C:p4", "A:d1 B:d1 C:p4*", "C:d1"}));
  ASSERT_GE(asked.size(), 3u);
  EXPECT_EQ(asked[0], (std::pair<int, int64_t>{0, 0}));
  EXPECT_EQ(asked[1], (std::pair<int, int64_t>{2, 6}));  // A and B decode position 2: 3 keys each
  EXPECT_EQ(asked[2], (std::pair<int, int64_t>{2, 8}));
  EXPECT_EQ(sim.finished()['C'], sim.Expected('C'));
}

TEST(SchedulerTest, PrefillRoomChargesAChunkForTheKeysItReadsAndKeepsAMinimum) {
  // budget 64; a chunk of n tokens at position s costs n + 0.5 (s + n) of a room of 20 per step; A: prompt
  // 30, B: prompt 4, one token each.
  //   1  A:p13        floor(20 / 1.5) = 13 (spends 19.5): nothing left for B
  //   2  A:p9         at 13: (20 - 6.5) / 1.5 = 9
  //   3  A:p6         at 22: (20 - 11) / 1.5 = 6
  //   4  A:p2* B:p2   at 28 the last 2 (spends 17); B gets 3 / 1.5 = 2
  //   5  B:p2*
  // Then with no room at all (decodes alone over the target) the first chunk still gets min_tokens (3).
  Sim sim(Opts(64), 64);
  double room = 20;
  sim.sched().set_prefill_room([&](int, int64_t) {
    return Scheduler::PrefillRoom{.seconds = room, .per_token = 1, .per_kv_position = 0.5, .min_tokens = 3};
  });
  sim.Add('A', 30, 1);
  sim.Add('B', 4, 1);
  EXPECT_EQ(sim.Step(), "A:p13");
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kTokenBudget);
  EXPECT_EQ(sim.Run(4), (std::vector<std::string>{"A:p9", "A:p6", "A:p2* B:p2", "B:p2*"}));
  EXPECT_EQ(sim.finished()['A'], sim.Expected('A'));
  room = -5;
  sim.Add('C', 10, 1);
  sim.Add('D', 10, 1);
  EXPECT_EQ(sim.Run(2), (std::vector<std::string>{"C:p3", "C:p3"}));
  EXPECT_EQ(sim.last().prefill_cap, 3);
}

TEST(SchedulerTest, MaxSeqsCapsTheRunningSet) {
  // max_seqs 2; A, B, C: prompt 3, 2 tokens.
  //   1  A:p3* B:p3*          C waits (max_seqs)
  //   2  A:d1 B:d1            both done
  //   3  C:p3*
  //   4  C:d1
  Sim sim(Opts(64, /*max_seqs=*/2), 32);
  sim.Add('A', 3, 2);
  sim.Add('B', 3, 2);
  sim.Add('C', 3, 2);
  EXPECT_EQ(sim.Step(), "A:p3* B:p3*");
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kMaxSeqs);
  EXPECT_EQ(sim.Step(), "A:d1 B:d1");
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kMaxSeqs);
  EXPECT_EQ(sim.Step(), "C:p3*");
  EXPECT_EQ(sim.Step(), "C:d1");
}

TEST(SchedulerTest, UnchunkedPrefillWaitsForAWholeBudget) {
  // budget 8, chunking off; A: prompt 3; B: prompt 7.
  //   1  A:p3*                B (7) does not fit the 5 left: waits whole (token_budget)
  //   2  A:d1 B:p7*
  Sim sim(Opts(8, 64, /*chunked=*/false), 32);
  sim.Add('A', 3, 3);
  sim.Add('B', 7, 2);
  EXPECT_EQ(sim.Step(), "A:p3*");
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kTokenBudget);
  EXPECT_EQ(sim.Step(), "A:d1 B:p7*");
  // A prompt longer than the whole budget can never run unchunked.
  EXPECT_EQ(sim.sched().Add(99, Tokens(9, 0)).code(), StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, RejectsPromptsThatCanNeverFit) {
  BlockAllocator alloc({.num_blocks = 2, .block_size = 4});
  Scheduler sched(Opts(64), &alloc);
  EXPECT_EQ(sched.Add(1, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sched.Add(2, Tokens(8, 0)).code(), StatusCode::kInvalidArgument);  // 8 + 1 slots > 2 blocks
  EXPECT_TRUE(sched.Add(3, Tokens(7, 0)).ok());
  EXPECT_EQ(sched.Add(3, Tokens(7, 0)).code(), StatusCode::kAlreadyExists);
}

TEST(SchedulerTest, PreemptsLatestArrivalAndResumesWithSameOutput) {
  // 4 blocks of 4 slots (16 tokens of KV); A, B: prompt 6, 6 tokens each (12 tokens = 3 blocks each).
  //   1  A:p6* B:p6*          2 blocks each: positions 0..7, cache full
  //   2  A:d1 B:d1            position 6
  //   3  A:d1 B:d1            position 7
  //   4  A:d1                 A needs a 3rd block for position 8: B (latest arrival) is preempted, keeping
  //                           its 3 generated tokens (9 to recompute); its full blocks go to the prefix cache
  //                           and A's new block evicts one of them (the tail)
  //   5  A:d1                 B waits: no blocks
  //   6  A:d1                 A done
  //   7  B:p5*                B's first block is still cached: 4 of 9 tokens reused, 4 recomputed + 1 new
  //   8  B:d1
  //   9  B:d1                 B done: the same tokens as if it had run alone
  Sim sim(Opts(64), /*num_blocks=*/4);
  sim.Add('A', 6, 6);
  sim.Add('B', 6, 6);
  EXPECT_EQ(sim.Run(3), (std::vector<std::string>{"A:p6* B:p6*", "A:d1 B:d1", "A:d1 B:d1"}));
  EXPECT_EQ(sim.Step(), "A:d1");
  EXPECT_EQ(sim.last().preempted, std::vector<SeqId>{'B'});
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kNoBlocks);
  EXPECT_EQ(sim.sched().Find('B')->num_computed, 0);
  EXPECT_EQ(sim.sched().Tokens('B').size(), 9u);  // prompt + 3 generated kept for recompute
  EXPECT_EQ(sim.Step(), "A:d1");
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kNoBlocks);
  EXPECT_EQ(sim.Step(), "A:d1");
  EXPECT_EQ(sim.finished().count('A'), 1u);
  EXPECT_EQ(sim.Step(), "B:p5*");
  EXPECT_EQ(sim.sched().counters().recompute_tokens, 4);
  EXPECT_EQ(sim.Run(3), (std::vector<std::string>{"B:d1", "B:d1", ""}));
  EXPECT_EQ(sim.finished()['A'], sim.Expected('A'));
  EXPECT_EQ(sim.finished()['B'], sim.Expected('B'));
  EXPECT_EQ(sim.sched().counters().preemptions, 1);
  // Recompute is not a prefix hit: only the first admissions count.
  EXPECT_EQ(sim.sched().counters().prefix_hit_tokens, 0);
}

TEST(SchedulerTest, PreemptsItselfWhenItRanksLast) {
  // 4 blocks; H (priority 9): prompt 7 (2 blocks); L (priority 0): prompt 8 (2 blocks, full).
  //   1  H:p7* L:p8*          cache full
  //   2  H:d1                 H writes position 7 (fits) and is done. L needs a 3rd block for position 8 and
  //                           nobody ranks lower: L preempts itself.
  //   3  L:p1*                both of L's full blocks were still cached: only the missing token is computed
  Sim sim(Opts(64), /*num_blocks=*/4);
  sim.Add('H', 7, 2, /*priority=*/9);
  sim.Add('L', 8, 2, /*priority=*/0);
  EXPECT_EQ(sim.Step(), "H:p7* L:p8*");
  EXPECT_EQ(sim.Step(), "H:d1");
  EXPECT_EQ(sim.last().preempted, std::vector<SeqId>{'L'});
  EXPECT_EQ(sim.Step(), "L:p1*");
  EXPECT_EQ(sim.Step(), "");
  EXPECT_EQ(sim.finished()['L'], sim.Expected('L'));
}

TEST(SchedulerTest, PriorityOrdersAdmissionAndChoosesTheVictim) {
  // max_seqs 1; L (priority 0) arrives first, H (priority 9) second: H runs first.
  Sim sim(Opts(64, /*max_seqs=*/1), 32);
  sim.Add('L', 3, 1, /*priority=*/0);
  sim.Add('H', 3, 1, /*priority=*/9);
  EXPECT_EQ(sim.Step(), "H:p3*");
  EXPECT_EQ(sim.Step(), "L:p3*");

  // Victim: the lowest priority, even though it arrived first. 4 blocks; L: prompt 7, then H: prompt 8.
  //   1  H:p8* L:p7*          H first by priority; 2 blocks each, cache full
  //   2  H:d1                 H needs a 3rd block for position 8: L (priority 0) is preempted, not H
  Sim sim2(Opts(64), /*num_blocks=*/4);
  sim2.Add('L', 7, 5, /*priority=*/0);
  sim2.Add('H', 8, 5, /*priority=*/9);
  EXPECT_EQ(sim2.Step(), "H:p8* L:p7*");
  EXPECT_EQ(sim2.Step(), "H:d1");
  EXPECT_EQ(sim2.last().preempted, std::vector<SeqId>{'L'});
}

TEST(SchedulerTest, PreemptedSequenceGoesBackInFrontOfLaterArrivals) {
  // 4 blocks; A: prompt 6, 4 tokens; B: prompt 6, 6 tokens (2 blocks each). C (prompt 1) arrives later.
  //   1  A:p6* B:p6*
  //   2  A:d1 B:d1            C: no blocks
  //   3  A:d1 B:d1
  //   4  A:d1                 A needs a block: B preempted; A done
  //   5  B:p5* C:p1*          B (earlier arrival) is admitted before C
  Sim sim(Opts(64), /*num_blocks=*/4);
  sim.Add('A', 6, 4);
  sim.Add('B', 6, 6);
  EXPECT_EQ(sim.Step(), "A:p6* B:p6*");
  sim.Add('C', 1, 1);
  EXPECT_EQ(sim.Step(), "A:d1 B:d1");
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kNoBlocks);
  EXPECT_EQ(sim.Step(), "A:d1 B:d1");
  EXPECT_EQ(sim.Step(), "A:d1");
  EXPECT_EQ(sim.last().preempted, std::vector<SeqId>{'B'});
  EXPECT_EQ(sim.Step(), "B:p5* C:p1*");
}

TEST(SchedulerTest, CancellationFreesBlocksAtTheNextStep) {
  Sim sim(Opts(64), 32);
  sim.Add('A', 9, 10);
  sim.Add('B', 3, 10);
  EXPECT_EQ(sim.Step(), "A:p9* B:p3*");
  const int used = sim.alloc().NumUsedBlocks();
  EXPECT_EQ(used, 3 + 1);
  sim.sched().Cancel('A');
  sim.sched().Cancel(12345);                     // unknown: ignored
  EXPECT_EQ(sim.alloc().NumUsedBlocks(), used);  // nothing happens until the step boundary
  EXPECT_EQ(sim.Step(), "B:d1");
  EXPECT_EQ(sim.last().cancelled, std::vector<SeqId>{'A'});
  EXPECT_FALSE(sim.sched().Contains('A'));
  EXPECT_EQ(sim.alloc().NumUsedBlocks(), 1);

  // A waiting sequence can be cancelled too.
  sim.Add('C', 3, 1);
  sim.sched().Cancel('C');
  EXPECT_EQ(sim.Step(), "B:d1");
  EXPECT_EQ(sim.last().cancelled, std::vector<SeqId>{'C'});
  EXPECT_EQ(sim.sched().num_waiting(), 0);
  EXPECT_EQ(sim.sched().counters().cancelled, 2);
}

TEST(SchedulerTest, PrefixHitsReducePrefillTokens) {
  // A and B share a 16-token "system prompt" (4 blocks) and differ after it.
  //   1  A:p19*               nothing cached
  //   2  A:d1                 A done
  //   3  B:p3*                16 tokens from the cache: 3 computed
  Sim sim(Opts(64), 32);
  sim.Add('A', 19, 2, 0, /*first_token=*/500);
  EXPECT_EQ(sim.Step(), "A:p19*");
  EXPECT_EQ(sim.Step(), "A:d1");
  std::vector<int32_t> b = Tokens(16, 500);
  b.insert(b.end(), {7, 8, 9});
  ASSERT_TRUE(sim.sched().Add('B', b).ok());
  EXPECT_EQ(sim.Step(), "B:p3*");
  EXPECT_EQ(sim.last().num_cached_tokens, 16);
  EXPECT_EQ(sim.sched().Find('B')->num_cached_tokens, 16);
  EXPECT_EQ(sim.sched().counters().prefix_query_tokens, 19 + 19);
  EXPECT_EQ(sim.sched().counters().prefix_hit_tokens, 16);
  EXPECT_EQ(sim.alloc().stats().hits, 4);
}

TEST(SchedulerTest, WatermarkKeepsBlocksForRunningSequences) {
  // 6 blocks, watermark 2. A: prompt 8 (2 blocks) runs. B: prompt 8 needs 2 of the 4 available, leaving 2:
  // admitted. C: prompt 4 would leave 1 < 2: waits (no_blocks) although a block is free.
  SchedulerOptions o = Opts(64);
  o.watermark_blocks = 2;
  Sim sim(o, /*num_blocks=*/6);
  sim.Add('A', 7, 20);
  EXPECT_EQ(sim.Step(), "A:p7*");  // nothing running: no watermark
  sim.Add('B', 8, 20);
  sim.Add('C', 4, 20);
  EXPECT_EQ(sim.Step(), "A:d1 B:p8*");
  EXPECT_EQ(sim.last().admission_stop, AdmissionStop::kNoBlocks);
  EXPECT_EQ(sim.last().blocks_free, 2);
}

// Random workloads on a small cache: every sequence must finish with exactly its own tokens, within a bound
// on steps (no livelock), with invariants holding after every step and all blocks released at the end.
TEST(SchedulerPropertyTest, RandomWorkloadsFinishWithTheirOwnTokens) {
  int64_t total_preemptions = 0;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    SchedulerOptions o = Opts(uni(4, 40), uni(1, 8), /*chunked=*/seed % 4 != 0);
    o.watermark_blocks = uni(0, 1);
    BlockAllocator alloc({.num_blocks = uni(8, 24), .block_size = uni(1, 3) * 2});
    Scheduler sched(o, &alloc);
    std::map<SeqId, std::vector<int32_t>> expect;
    std::map<SeqId, int> max_tokens, generated;
    const std::vector<int32_t> system = Tokens(uni(0, 12), 7);
    const int capacity = alloc.num_blocks() * alloc.block_size();
    int64_t preemptions = 0;
    SeqId next = 1;
    for (int step = 0; step < 5000 && (next <= 40 || sched.HasWork()); ++step) {
      if (next <= 40 && uni(0, 2) == 0) {
        std::vector<int32_t> prompt = uni(0, 1) ? system : std::vector<int32_t>{};
        for (int i = uni(1, 10); i > 0; --i) prompt.push_back(uni(0, 5));
        const int max_t = uni(1, 12);
        if (static_cast<int>(prompt.size()) + max_t <= capacity &&
            (o.enable_chunked_prefill || static_cast<int>(prompt.size()) <= o.max_num_batched_tokens)) {
          std::vector<int32_t> e = prompt;
          for (int n = 0; n < max_t; ++n) e.push_back(Gen(next, n));
          ASSERT_TRUE(sched.Add(next, prompt, uni(0, 2)).ok());
          expect[next] = e;
          max_tokens[next] = max_t;
        }
        ++next;
      }
      if (!expect.empty() && uni(0, 40) == 0) {  // a client goes away
        auto it = expect.begin();
        std::advance(it, uni(0, expect.size() - 1));
        sched.Cancel(it->first);
      }
      StepPlan plan = sched.Schedule();
      preemptions += plan.preempted.size();
      for (SeqId id : plan.cancelled) expect.erase(id);
      ASSERT_LE(plan.num_tokens(), o.max_num_batched_tokens);
      sched.CompleteStep(plan);
      for (const ScheduledSeq& s : plan.seqs) {
        if (!s.sample) continue;
        ASSERT_TRUE(sched.AppendToken(s.id, Gen(s.id, generated[s.id])).ok());
        if (++generated[s.id] == max_tokens[s.id]) {
          std::span<const int32_t> got = sched.Tokens(s.id);
          ASSERT_EQ(std::vector<int32_t>(got.begin(), got.end()), expect[s.id]) << "seq " << s.id;
          expect.erase(s.id);
          sched.Finish(s.id);
        }
      }
      Status st = alloc.CheckInvariants();
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    EXPECT_FALSE(sched.HasWork()) << "livelock: " << sched.num_running() << " running, "
                                  << sched.num_waiting() << " waiting";
    EXPECT_TRUE(expect.empty());
    EXPECT_EQ(alloc.NumUsedBlocks(), 0);
    total_preemptions += preemptions;
  }
  EXPECT_GT(total_preemptions, 20) << "workloads too easy to exercise preemption";
}

}  // namespace
}  // namespace stoke
