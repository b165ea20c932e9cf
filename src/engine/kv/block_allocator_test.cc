#include "engine/kv/block_allocator.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace stoke {
namespace {

std::vector<int32_t> Iota(int n, int32_t start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Opens `seq`, grows it to the whole of `tokens` and commits them, as a prefill would.
void Prefill(BlockAllocator& a, SeqId seq, const std::vector<int32_t>& tokens) {
  ASSERT_TRUE(a.Open(seq, tokens).ok());
  ASSERT_TRUE(a.Grow(seq, tokens.size(), nullptr).ok());
  a.Commit(seq, tokens);
  ASSERT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants().ToString();
}

TEST(BlockAllocatorTest, SizesFromBudget) {
  // 1 MiB of KV at 1 KiB per token and 16 tokens per block: 64 blocks.
  EXPECT_EQ(BlockAllocator::NumBlocksForBudget(1 << 20, 1024, 16), 64);
  EXPECT_EQ(BlockAllocator::NumBlocksForBudget((1 << 20) - 1, 1024, 16), 63);
  EXPECT_EQ(BlockAllocator::NumBlocksForBudget(0, 1024, 16), 0);
  EXPECT_EQ(BlockAllocator::NumBlocksForBudget(1 << 20, 0, 16), 0);
}

TEST(BlockAllocatorTest, GrowAllocatesCoveringBlocksAndFreeReturnsThem) {
  BlockAllocator a({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = false});
  ASSERT_TRUE(a.Open(1, Iota(9)).ok());
  EXPECT_EQ(a.BlocksToGrow(1, 9), 3);
  ASSERT_TRUE(a.Grow(1, 9, nullptr).ok());
  EXPECT_EQ(a.BlockTable(1).size(), 3u);
  EXPECT_EQ(a.NumUsedBlocks(), 3);
  EXPECT_EQ(a.BlocksToGrow(1, 12), 0);  // position 9..11 fit in the third block
  EXPECT_EQ(a.BlocksToGrow(1, 13), 1);
  a.Free(1);
  EXPECT_EQ(a.NumUsedBlocks(), 0);
  EXPECT_EQ(a.NumFreeBlocks(), 8);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(BlockAllocatorTest, GrowFailsWithoutChangeWhenFull) {
  BlockAllocator a({.num_blocks = 3, .block_size = 4});
  ASSERT_TRUE(a.Open(1, Iota(8)).ok());
  ASSERT_TRUE(a.Grow(1, 8, nullptr).ok());
  ASSERT_TRUE(a.Open(2, Iota(8, 100)).ok());
  Status st = a.Grow(2, 8, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(a.BlockTable(2).empty());
  EXPECT_EQ(a.NumAvailableBlocks(), 1);
  EXPECT_FALSE(a.CanAllocate(2));
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(BlockAllocatorTest, DuplicateOpenIsAnError) {
  BlockAllocator a({.num_blocks = 4, .block_size = 4});
  ASSERT_TRUE(a.Open(7, Iota(3)).ok());
  EXPECT_EQ(a.Open(7, Iota(3)).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(a.Grow(8, 4, nullptr).code(), StatusCode::kNotFound);
}

TEST(BlockAllocatorTest, ReusesCachedPrefixAfterRelease) {
  BlockAllocator a({.num_blocks = 16, .block_size = 4});
  const std::vector<int32_t> prompt = Iota(10);  // blocks [0..3] [4..7] [8,9]
  Prefill(a, 1, prompt);
  const std::vector<BlockId> first = a.BlockTable(1);
  a.Free(1);
  EXPECT_EQ(a.NumCachedBlocks(), 2);  // the two full blocks stay cached
  EXPECT_EQ(a.NumUsedBlocks(), 0);

  std::vector<int32_t> other = Iota(9);  // same first 9 tokens: both full blocks match
  other.push_back(555);
  EXPECT_EQ(a.MatchPrefix(other), 8);
  EXPECT_EQ(a.BlocksToStart(other, other.size()), 3);  // 2 cached (leave the pool) + 1 fresh
  auto cached = a.Open(2, other);
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(*cached, 8);
  EXPECT_EQ(a.BlockTable(2)[0], first[0]);
  EXPECT_EQ(a.BlockTable(2)[1], first[1]);
  EXPECT_EQ(a.NumCommittedTokens(2), 8);
  EXPECT_EQ(a.stats().hits, 2);
  EXPECT_EQ(a.stats().misses, 2);  // the first prompt's two blocks
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(BlockAllocatorTest, NeverReusesTheLastPromptToken) {
  BlockAllocator a({.num_blocks = 16, .block_size = 4});
  Prefill(a, 1, Iota(8));  // exactly two full blocks
  a.Free(1);
  // The same 8 tokens again: reuse stops at 7 tokens, i.e. one block, so the last token gets logits.
  EXPECT_EQ(a.MatchPrefix(Iota(8)), 4);
  EXPECT_EQ(a.MatchPrefix(Iota(9)), 8);
  EXPECT_EQ(a.MatchPrefix(Iota(1)), 0);
  EXPECT_EQ(a.MatchPrefix({}), 0);
}

TEST(BlockAllocatorTest, SharesBlocksInUseWithRefCounts) {
  BlockAllocator a({.num_blocks = 16, .block_size = 4});
  Prefill(a, 1, Iota(10));
  std::vector<int32_t> p2 = Iota(8);
  p2.insert(p2.end(), {70, 71, 72});
  // Both full blocks are in use by seq 1: reusing them takes nothing from the pool.
  EXPECT_EQ(a.BlocksToStart(p2, p2.size()), 1);
  Prefill(a, 2, p2);
  EXPECT_EQ(a.RefCount(a.BlockTable(1)[0]), 2);
  EXPECT_EQ(a.RefCount(a.BlockTable(1)[1]), 2);
  EXPECT_EQ(a.RefCount(a.BlockTable(1)[2]), 1);
  EXPECT_EQ(a.NumUsedBlocks(), 4);
  a.Free(1);
  EXPECT_EQ(a.RefCount(a.BlockTable(2)[0]), 1);
  EXPECT_EQ(a.NumUsedBlocks(), 3);
  EXPECT_EQ(a.NumFreeBlocks(), 13);  // seq 1's partial third block went back to the free list
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(BlockAllocatorTest, ChainedHashDistinguishesPosition) {
  // The same 4 tokens as a second block must not match a prompt that has them as its first block.
  BlockAllocator a({.num_blocks = 16, .block_size = 4});
  std::vector<int32_t> p = {9, 9, 9, 9, 1, 2, 3, 4, 5};
  Prefill(a, 1, p);
  a.Free(1);
  EXPECT_EQ(a.MatchPrefix(std::vector<int32_t>{1, 2, 3, 4, 5}), 0);
  EXPECT_EQ(a.MatchPrefix(std::vector<int32_t>{9, 9, 9, 9, 1, 2, 3, 4, 6}), 8);
  EXPECT_NE(BlockAllocator::HashBlock(BlockAllocator::kRootHash, std::vector<int32_t>{1, 2, 3, 4}),
            BlockAllocator::HashBlock(123, std::vector<int32_t>{1, 2, 3, 4}));
}

TEST(BlockAllocatorTest, EvictsLeastRecentlyReleasedTailFirst) {
  BlockAllocator a({.num_blocks = 4, .block_size = 2});
  Prefill(a, 1, {1, 2, 3, 4, 5});  // blocks A0 [1,2] A1 [3,4] A2 [5]
  const std::vector<BlockId> t1 = a.BlockTable(1);
  a.Free(1);  // A1 then A0 become cached (tail first); A2 is free
  EXPECT_EQ(a.NumCachedBlocks(), 2);
  EXPECT_EQ(a.NumFreeBlocks(), 2);

  // 3 fresh blocks: 2 free ones, then one eviction, which must take A1 (the tail), keeping A0 matchable.
  Prefill(a, 2, {50, 51, 52, 53, 54});
  EXPECT_EQ(a.stats().evictions, 1);
  EXPECT_FALSE(a.IsCached(t1[1]));
  EXPECT_TRUE(a.IsCached(t1[0]));
  EXPECT_EQ(a.MatchPrefix(std::vector<int32_t>{1, 2, 3, 4, 5}), 2);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(BlockAllocatorTest, ConcurrentDuplicatePrefillRegistersOnce) {
  BlockAllocator a({.num_blocks = 8, .block_size = 2});
  const std::vector<int32_t> p = {1, 2, 3};
  // Both open before either commits: no hits, both compute block [1,2].
  ASSERT_TRUE(a.Open(1, p).ok());
  ASSERT_TRUE(a.Open(2, p).ok());
  ASSERT_TRUE(a.Grow(1, 3, nullptr).ok());
  ASSERT_TRUE(a.Grow(2, 3, nullptr).ok());
  a.Commit(1, p);
  a.Commit(2, p);
  EXPECT_TRUE(a.IsCached(a.BlockTable(1)[0]));
  EXPECT_FALSE(a.IsCached(a.BlockTable(2)[0]));
  a.Free(1);
  a.Free(2);
  EXPECT_EQ(a.NumCachedBlocks(), 1);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(BlockAllocatorTest, ForkSharesAndCopiesOnWrite) {
  BlockAllocator a({.num_blocks = 8, .block_size = 4});
  Prefill(a, 1, Iota(6));  // full block + partial block of 2
  ASSERT_TRUE(a.Fork(1, 2).ok());
  EXPECT_EQ(a.BlockTable(2), a.BlockTable(1));
  EXPECT_EQ(a.RefCount(a.BlockTable(1)[1]), 2);
  EXPECT_EQ(a.Fork(1, 2).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(a.Fork(9, 3).code(), StatusCode::kNotFound);

  // Seq 2 writes position 6 into the shared partial block: it gets its own copy, the full block stays shared.
  EXPECT_EQ(a.BlocksToGrow(2, 7), 1);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(a.Grow(2, 7, &copies).ok());
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a.BlockTable(1)[1]);
  EXPECT_EQ(copies[0].dst, a.BlockTable(2)[1]);
  EXPECT_EQ(a.BlockTable(2)[0], a.BlockTable(1)[0]);
  EXPECT_EQ(a.RefCount(a.BlockTable(1)[1]), 1);
  // Seq 1 now owns its partial block alone: no copy.
  copies.clear();
  ASSERT_TRUE(a.Grow(1, 7, &copies).ok());
  EXPECT_TRUE(copies.empty());
  EXPECT_TRUE(a.CheckInvariants().ok());
}

TEST(BlockAllocatorTest, ResetPrefixCacheDropsCachedBlocks) {
  BlockAllocator a({.num_blocks = 8, .block_size = 2});
  Prefill(a, 1, {1, 2, 3, 4, 5});
  a.Free(1);
  EXPECT_EQ(a.ResetPrefixCache(), 2);
  EXPECT_EQ(a.NumCachedBlocks(), 0);
  EXPECT_EQ(a.MatchPrefix(std::vector<int32_t>{1, 2, 3, 4, 5}), 0);
  EXPECT_TRUE(a.CheckInvariants().ok());
}

// ---- Property test: random interleavings against a shadow KV store.
// ----------------------------------------
//
// The test plays the model: every Grow is followed by "writing" each new token's id into its slot of a
// shadow KV array (after applying the copy-on-write list), and Commit. After every operation, each live
// sequence must read its own tokens back through its block table. That catches a block handed out while in
// use, a wrong prefix hit, a missed copy-on-write, and eviction of a block someone holds; CheckInvariants
// catches leaks, double frees and ref-count drift.
struct ShadowSeq {
  std::vector<int32_t> tokens;  // prompt + "generated"
  int committed = 0;
};

class AllocatorFuzz {
 public:
  AllocatorFuzz(uint32_t seed, int num_blocks, int block_size)
      : rng_(seed),
        alloc_({.num_blocks = num_blocks, .block_size = block_size}),
        bs_(block_size),
        kv_(static_cast<size_t>(num_blocks) * block_size, -1) {
    // A few shared "system prompts" so prefixes repeat.
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> p(Uniform(0, 6 * bs_));
      for (auto& t : p) t = Uniform(0, 3);
      systems_.push_back(p);
    }
  }

  void Run(int ops) {
    for (int i = 0; i < ops && !::testing::Test::HasFatalFailure(); ++i) {
      const int op = Uniform(0, 99);
      if (op < 20 || live_.empty()) {
        OpOpen();
      } else if (op < 75) {
        OpCompute(Pick());
      } else if (op < 82) {
        OpFork(Pick());
      } else if (op < 99) {
        OpFree(Pick());
      } else {
        alloc_.ResetPrefixCache();
      }
      Check();
    }
    while (!live_.empty()) {
      OpFree(live_.begin()->first);
      Check();
    }
    EXPECT_EQ(alloc_.NumUsedBlocks(), 0);
    EXPECT_EQ(alloc_.NumFreeBlocks() + alloc_.NumCachedBlocks(), alloc_.num_blocks());
  }

  int64_t opens() const { return opens_; }
  const BlockAllocator& alloc() const { return alloc_; }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  SeqId Pick() {
    auto it = live_.begin();
    std::advance(it, Uniform(0, live_.size() - 1));
    return it->first;
  }

  void OpOpen() {
    ShadowSeq s;
    s.tokens = systems_[Uniform(0, systems_.size() - 1)];
    const int extra = Uniform(1, 3 * bs_);
    for (int i = 0; i < extra; ++i) s.tokens.push_back(Uniform(0, 3));
    const SeqId id = next_id_++;
    const int predicted_match = alloc_.MatchPrefix(s.tokens);
    const int target = Uniform(predicted_match + 1, s.tokens.size());
    const int predicted_blocks = alloc_.BlocksToStart(s.tokens, target);
    const int before = alloc_.NumAvailableBlocks();
    if (!alloc_.CanAllocate(predicted_blocks)) return;  // a scheduler would not admit it
    auto cached = alloc_.Open(id, s.tokens);
    ASSERT_TRUE(cached.ok());
    ASSERT_EQ(*cached, predicted_match);
    ASSERT_LT(*cached, static_cast<int>(s.tokens.size()));
    s.committed = *cached;
    live_[id] = s;
    ++opens_;
    // The reused prefix must already hold exactly these tokens.
    ExpectReadsBack(id);
    WriteAndCommit(id, target);
    ASSERT_EQ(before - alloc_.NumAvailableBlocks(), predicted_blocks) << "BlocksToStart mispredicted";
  }

  void OpCompute(SeqId id) {
    ShadowSeq& s = live_[id];
    if (s.committed == static_cast<int>(s.tokens.size())) s.tokens.push_back(Uniform(0, 3));  // "sampled"
    const int target = Uniform(s.committed + 1, std::min<int>(s.tokens.size(), s.committed + 2 * bs_));
    const int need = alloc_.BlocksToGrow(id, target);
    const int before = alloc_.NumAvailableBlocks();
    if (!alloc_.CanAllocate(need)) {
      const std::vector<BlockId> table = alloc_.BlockTable(id);
      ASSERT_EQ(alloc_.Grow(id, target, nullptr).code(), StatusCode::kResourceExhausted);
      ASSERT_EQ(alloc_.BlockTable(id), table);
      return;
    }
    WriteAndCommit(id, target);
    ASSERT_EQ(before - alloc_.NumAvailableBlocks(), need) << "BlocksToGrow mispredicted";
  }

  void OpFork(SeqId parent) {
    const SeqId child = next_id_++;
    ASSERT_TRUE(alloc_.Fork(parent, child).ok());
    live_[child] = live_[parent];
  }

  void OpFree(SeqId id) {
    alloc_.Free(id);
    live_.erase(id);
  }

  // Grows `id` to `target` tokens, applies copies, writes tokens [committed, target) and commits.
  void WriteAndCommit(SeqId id, int target) {
    ShadowSeq& s = live_[id];
    std::vector<BlockCopy> copies;
    ASSERT_TRUE(alloc_.Grow(id, target, &copies).ok());
    for (const BlockCopy& c : copies) {
      std::copy_n(kv_.begin() + c.src * bs_, bs_, kv_.begin() + c.dst * bs_);
    }
    const std::vector<BlockId>& table = alloc_.BlockTable(id);
    // Every block this write touches must belong to this sequence alone.
    for (int p = s.committed; p < target; ++p) {
      const BlockId b = table[p / bs_];
      ASSERT_EQ(alloc_.RefCount(b), 1) << "writing into a shared block " << b;
      ASSERT_FALSE(alloc_.IsCached(b)) << "writing into a registered block " << b;
      kv_[b * bs_ + p % bs_] = s.tokens[p];
    }
    s.committed = target;
    alloc_.Commit(id, std::span<const int32_t>(s.tokens.data(), target));
  }

  void ExpectReadsBack(SeqId id) {
    const ShadowSeq& s = live_[id];
    const std::vector<BlockId>& table = alloc_.BlockTable(id);
    ASSERT_EQ(alloc_.NumCommittedTokens(id), s.committed);
    for (int p = 0; p < s.committed; ++p) {
      ASSERT_EQ(kv_[table[p / bs_] * bs_ + p % bs_], s.tokens[p]) << "seq " << id << " position " << p;
    }
  }

  void Check() {
    Status st = alloc_.CheckInvariants();
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (const auto& [id, s] : live_) ExpectReadsBack(id);
  }

  std::mt19937 rng_;
  BlockAllocator alloc_;
  int bs_;
  std::vector<int32_t> kv_;  // [num_blocks * block_size] token id written in each slot
  std::vector<std::vector<int32_t>> systems_;
  std::map<SeqId, ShadowSeq> live_;
  SeqId next_id_ = 1;
  int64_t opens_ = 0;
};

TEST(BlockAllocatorPropertyTest, RandomInterleavingsKeepInvariants) {
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    AllocatorFuzz fuzz(seed, /*num_blocks=*/48, /*block_size=*/seed % 2 ? 4 : 2);
    fuzz.Run(4000);
    if (HasFatalFailure()) return;
    const BlockAllocatorStats st = fuzz.alloc().stats();
    // The workload repeats prefixes and overflows the cache: both paths must have been exercised.
    EXPECT_GT(st.hits, 0);
    EXPECT_GT(st.evictions, 0);
    EXPECT_GT(fuzz.opens(), 100);
  }
}

TEST(BlockAllocatorPropertyTest, LargerBlocksLongerRun) {
  AllocatorFuzz fuzz(/*seed=*/99, /*num_blocks=*/128, /*block_size=*/16);
  fuzz.Run(20000);
}

}  // namespace
}  // namespace stoke
