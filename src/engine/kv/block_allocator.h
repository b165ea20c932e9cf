// The paged KV cache's bookkeeping: which fixed-size blocks of token slots each sequence owns, with reference
// counts so blocks can be shared (prefix caching, forks), and a prefix cache that remembers full blocks by a
// chained hash of their tokens so a new prompt that starts like an earlier one skips recomputing it.
//
// Nouns (vLLM's): a block holds `block_size` consecutive token positions of one sequence; a sequence's
// BlockTable maps position p to slot table[p / block_size] * block_size + p % block_size. A FULL block whose
// KV is written is identified by hash(parent block's hash, its tokens), so equal hashes mean equal prefixes.
//
// Block states (every block is in exactly one):
//   used    ref > 0: in at least one sequence's table
//   cached  ref == 0 but its hash is registered: reusable by a prompt with the same prefix; evicted (least
//           recently released first) when a fresh block is needed and no free block is left
//   free    ref == 0, no hash
// Nothing here touches KV memory: the model owns it and copies a block when told to (BlockCopy).
// Not thread-safe: the engine thread alone owns it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace stoke {

using BlockId = int32_t;
using SeqId = int64_t;
using BlockHash = uint64_t;

struct BlockAllocatorOptions {
  int num_blocks = 0;  // capacity; see NumBlocksForBudget
  int block_size =
      16;  // token positions per block (vLLM's default: smaller wastes less, larger has less overhead)
  bool enable_prefix_caching = true;  // off: released blocks go straight back to the free list
};

// Copy block `src`'s KV to `dst` before the step runs (copy-on-write of a block shared after Fork).
struct BlockCopy {
  BlockId src = 0;
  BlockId dst = 0;
};

struct BlockAllocatorStats {
  int num_blocks = 0;
  int used = 0;    // ref > 0
  int cached = 0;  // ref == 0, reusable by prefix, evictable
  int free = 0;    // ref == 0, empty
  // Cumulative, in blocks. A lookup considers the prompt's full blocks below the reuse cap (prompt_len - 1).
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;  // cached blocks dropped to serve a fresh allocation
};

class BlockAllocator {
 public:
  explicit BlockAllocator(const BlockAllocatorOptions& options);
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  // Blocks that fit in `budget_bytes` of KV memory: budget / (kv_bytes_per_token * block_size).
  static int NumBlocksForBudget(int64_t budget_bytes, int64_t kv_bytes_per_token, int block_size);
  // The chained hash of one full block (exposed for tests and for the scheduler's accounting).
  static BlockHash HashBlock(BlockHash parent, std::span<const int32_t> tokens);
  static constexpr BlockHash kRootHash = 0x5eed'0f'b10c'5eedull;  // the parent of a sequence's first block

  int block_size() const { return block_size_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int NumUsedBlocks() const { return num_used_; }
  int NumCachedBlocks() const { return lru_size_; }
  int NumFreeBlocks() const { return static_cast<int>(free_.size()); }
  // Blocks a fresh allocation can take now: free plus evictable cached.
  int NumAvailableBlocks() const { return NumFreeBlocks() + NumCachedBlocks(); }
  bool CanAllocate(int num_fresh_blocks) const { return num_fresh_blocks <= NumAvailableBlocks(); }
  static int BlocksForTokens(int num_tokens, int block_size) {
    return (num_tokens + block_size - 1) / block_size;
  }

  // --- Starting a sequence -------------------------------------------------------------------------------
  // Tokens of `tokens` that cached blocks already hold: a multiple of block_size, at most tokens.size() - 1
  // (the last prompt token is always computed, because its logits are needed). No side effects.
  int MatchPrefix(std::span<const int32_t> tokens) const;
  // Blocks Open(tokens) followed by Grow(num_tokens) would take from the available pool. Reused blocks that
  // are cached (ref 0) count, since they leave the evictable pool; reused blocks already in use do not.
  int BlocksToStart(std::span<const int32_t> tokens, int num_tokens) const;
  // Registers a sequence and takes a reference on every cached block of its prompt prefix (see
  // MatchPrefix). Returns the number of tokens whose KV is already there. Counts hits/misses.
  // AlreadyExists if `seq` is open.
  StatusOr<int> Open(SeqId seq, std::span<const int32_t> tokens);

  // --- Growing ---------------------------------------------------------------------------------------------
  // Fresh blocks Grow(seq, num_tokens) needs (including copy-on-write of shared blocks it will write).
  int BlocksToGrow(SeqId seq, int num_tokens) const;
  // Makes the table cover positions [0, num_tokens) and ensures every block holding a position at or after
  // the committed count is this sequence's alone; shared ones are replaced by copies listed in `copies`
  // (appended). ResourceExhausted (and no change) when not enough blocks are available.
  Status Grow(SeqId seq, int num_tokens, std::vector<BlockCopy>* copies);
  // Records that KV for tokens[0, tokens.size()) of `seq` is now written. Full blocks get their chained hash
  // and are registered in the prefix cache (unless an identical block is already registered).
  // `tokens` is the sequence's whole token list so far (must extend what was committed before).
  void Commit(SeqId seq, std::span<const int32_t> tokens);

  // --- Sharing and ending ----------------------------------------------------------------------------------
  // `child` shares all of `parent`'s blocks (ref++) and its committed state (parallel sampling / beam).
  Status Fork(SeqId parent, SeqId child);
  // Drops the sequence's references; blocks reaching ref 0 become cached (if hashed) or free.
  // The last blocks of the sequence are released first so they are evicted before its prefix. Unknown: no-op.
  void Free(SeqId seq);
  // Drops every cached (ref 0) block's hash, e.g. after the weights change. Returns how many.
  int ResetPrefixCache();

  bool Contains(SeqId seq) const { return seqs_.count(seq) != 0; }
  // Block ids covering the sequence's positions, outermost first. Empty for unknown ids.
  const std::vector<BlockId>& BlockTable(SeqId seq) const;
  int NumCommittedTokens(SeqId seq) const;
  int RefCount(BlockId block) const { return blocks_[block].ref; }
  bool IsCached(BlockId block) const { return blocks_[block].hashed; }
  BlockAllocatorStats stats() const;

  // Full consistency check (O(num_blocks + table sizes)): ref counts equal table occurrences, each block in
  // exactly one state, the hash index matches, counters add up. For tests; returns what is wrong.
  Status CheckInvariants() const;

 private:
  static constexpr BlockId kNone = -1;
  struct Block {
    int32_t ref = 0;
    bool hashed = false;  // registered in hash_index_
    BlockHash hash = 0;
    BlockHash parent = 0;
    std::vector<int32_t>
        tokens;  // the block's tokens when hashed: compared on lookup, so collisions can't alias
    BlockId lru_prev = kNone;  // links while cached (ref 0, hashed)
    BlockId lru_next = kNone;
  };
  struct Seq {
    std::vector<BlockId> table;
    std::vector<BlockHash> hashes;  // chained hashes of its full committed blocks, in order
    int committed = 0;              // tokens whose KV is written
  };

  // Walks the cache along `tokens`' full blocks below the reuse cap; returns the matching block ids.
  std::vector<BlockId> LookupPrefix(std::span<const int32_t> tokens) const;
  BlockId TakeFreshBlock();  // from the free list, else evicts the least recently released cached block
  void Release(BlockId b);   // ref--, and to cached/free at 0
  void LruRemove(BlockId b);
  void LruPushBack(BlockId b);
  void Unregister(BlockId b);

  int block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<BlockId> free_;  // stack of free block ids
  BlockId lru_head_ = kNone;   // least recently released cached block
  BlockId lru_tail_ = kNone;
  int lru_size_ = 0;
  int num_used_ = 0;
  std::unordered_map<BlockHash, BlockId> hash_index_;
  std::unordered_map<SeqId, Seq> seqs_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace stoke
