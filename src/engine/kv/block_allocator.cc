#include "engine/kv/block_allocator.h"

#include <algorithm>
#include <cassert>

namespace stoke {

BlockAllocator::BlockAllocator(const BlockAllocatorOptions& options)
    : block_size_(std::max(1, options.block_size)),
      prefix_caching_(options.enable_prefix_caching),
      blocks_(std::max(0, options.num_blocks)) {
  free_.reserve(blocks_.size());
  // A stack: push in reverse so block 0 is handed out first (easier to read in tests and traces).
  for (int b = num_blocks() - 1; b >= 0; --b) free_.push_back(b);
}

int BlockAllocator::NumBlocksForBudget(int64_t budget_bytes, int64_t kv_bytes_per_token, int block_size) {
  if (budget_bytes <= 0 || kv_bytes_per_token <= 0 || block_size <= 0) return 0;
  const int64_t n = budget_bytes / (kv_bytes_per_token * block_size);
  return static_cast<int>(std::min<int64_t>(n, INT32_MAX));
}

BlockHash BlockAllocator::HashBlock(BlockHash parent, std::span<const int32_t> tokens) {
  // FNV-1a over the parent and the tokens, then a splitmix64 finaliser to spread the bits. Lookups compare
  // the stored tokens and parent too, so a collision costs a miss, never wrong KV.
  uint64_t h = 0xcbf29ce484222325ull ^ parent;
  h *= 0x100000001b3ull;
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

std::vector<BlockId> BlockAllocator::LookupPrefix(std::span<const int32_t> tokens) const {
  std::vector<BlockId> found;
  if (!prefix_caching_ || tokens.empty()) return found;
  // Cap at size - 1 tokens: the last prompt token must run through the model to produce logits.
  const size_t max_blocks = (tokens.size() - 1) / block_size_;
  BlockHash parent = kRootHash;
  for (size_t i = 0; i < max_blocks; ++i) {
    auto chunk = tokens.subspan(i * block_size_, block_size_);
    const BlockHash h = HashBlock(parent, chunk);
    auto it = hash_index_.find(h);
    if (it == hash_index_.end()) break;
    const Block& blk = blocks_[it->second];
    if (blk.parent != parent ||
        !std::equal(chunk.begin(), chunk.end(), blk.tokens.begin(), blk.tokens.end())) {
      break;
    }
    found.push_back(it->second);
    parent = h;
  }
  return found;
}

int BlockAllocator::MatchPrefix(std::span<const int32_t> tokens) const {
  return static_cast<int>(LookupPrefix(tokens).size()) * block_size_;
}

int BlockAllocator::BlocksToStart(std::span<const int32_t> tokens, int num_tokens) const {
  const std::vector<BlockId> hits = LookupPrefix(tokens);
  const int total = std::max<int>(hits.size(), BlocksForTokens(num_tokens, block_size_));
  int in_use = 0;
  for (BlockId b : hits) in_use += blocks_[b].ref > 0;
  return total - in_use;
}

StatusOr<int> BlockAllocator::Open(SeqId seq, std::span<const int32_t> tokens) {
  if (seqs_.count(seq)) return AlreadyExistsError("sequence {} already holds KV blocks", seq);
  Seq& s = seqs_[seq];
  const std::vector<BlockId> hits = LookupPrefix(tokens);
  for (BlockId b : hits) {
    Block& blk = blocks_[b];
    if (blk.ref == 0) {
      LruRemove(b);
      ++num_used_;
    }
    ++blk.ref;
    s.table.push_back(b);
    s.hashes.push_back(blk.hash);
  }
  s.committed = static_cast<int>(hits.size()) * block_size_;
  if (prefix_caching_ && !tokens.empty()) {
    const int64_t candidates = (tokens.size() - 1) / block_size_;
    hits_ += hits.size();
    misses_ += candidates - static_cast<int64_t>(hits.size());
  }
  return s.committed;
}

int BlockAllocator::BlocksToGrow(SeqId seq, int num_tokens) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return BlocksForTokens(num_tokens, block_size_);
  const Seq& s = it->second;
  const int want = BlocksForTokens(num_tokens, block_size_);
  int need = std::max(0, want - static_cast<int>(s.table.size()));
  // Existing blocks this growth writes into that someone else also references: copy-on-write.
  const int first_written = s.committed / block_size_;
  const int last = std::min<int>(want, s.table.size());
  for (int i = first_written; i < last; ++i) need += blocks_[s.table[i]].ref > 1;
  return need;
}

Status BlockAllocator::Grow(SeqId seq, int num_tokens, std::vector<BlockCopy>* copies) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return NotFoundError("sequence {} holds no KV blocks", seq);
  const int need = BlocksToGrow(seq, num_tokens);
  if (!CanAllocate(need)) {
    return ResourceExhaustedError("KV cache full: sequence {} needs {} blocks, {} available", seq, need,
                                  NumAvailableBlocks());
  }
  Seq& s = it->second;
  const int want = BlocksForTokens(num_tokens, block_size_);
  const int first_written = s.committed / block_size_;
  const int last = std::min<int>(want, s.table.size());
  for (int i = first_written; i < last; ++i) {
    const BlockId src = s.table[i];
    if (blocks_[src].ref <= 1) continue;
    const BlockId dst = TakeFreshBlock();
    if (copies) copies->push_back({src, dst});
    Release(src);  // still referenced by the other sharer(s)
    s.table[i] = dst;
  }
  while (static_cast<int>(s.table.size()) < want) s.table.push_back(TakeFreshBlock());
  return OkStatus();
}

void BlockAllocator::Commit(SeqId seq, std::span<const int32_t> tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Seq& s = it->second;
  const int n = std::min<int>(tokens.size(), static_cast<int>(s.table.size()) * block_size_);
  assert(n == static_cast<int>(tokens.size()) && "Commit beyond the blocks the sequence holds");
  if (n <= s.committed) return;
  s.committed = n;
  const size_t full = n / block_size_;
  while (s.hashes.size() < full) {
    const size_t i = s.hashes.size();
    const BlockHash parent = i == 0 ? kRootHash : s.hashes[i - 1];
    auto chunk = tokens.subspan(i * block_size_, block_size_);
    const BlockHash h = HashBlock(parent, chunk);
    s.hashes.push_back(h);
    if (!prefix_caching_) continue;
    Block& blk = blocks_[s.table[i]];
    // A duplicate of a registered block (computed concurrently) stays unregistered and is freed on release.
    if (blk.hashed || hash_index_.count(h)) continue;
    blk.hashed = true;
    blk.hash = h;
    blk.parent = parent;
    blk.tokens.assign(chunk.begin(), chunk.end());
    hash_index_.emplace(h, s.table[i]);
  }
}

Status BlockAllocator::Fork(SeqId parent, SeqId child) {
  auto it = seqs_.find(parent);
  if (it == seqs_.end()) return NotFoundError("sequence {} holds no KV blocks", parent);
  if (seqs_.count(child)) return AlreadyExistsError("sequence {} already holds KV blocks", child);
  Seq copy = it->second;
  for (BlockId b : copy.table) ++blocks_[b].ref;
  seqs_.emplace(child, std::move(copy));
  return OkStatus();
}

void BlockAllocator::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Tail first: the LRU then evicts a sequence's last blocks before its prefix, which more prompts share.
  for (auto b = it->second.table.rbegin(); b != it->second.table.rend(); ++b) Release(*b);
  seqs_.erase(it);
}

int BlockAllocator::ResetPrefixCache() {
  int dropped = 0;
  while (lru_head_ != kNone) {
    const BlockId b = lru_head_;
    LruRemove(b);
    Unregister(b);
    free_.push_back(b);
    ++dropped;
  }
  // Blocks still in use lose their registration too; they return to the free list when released.
  for (Block& blk : blocks_) {
    blk.hashed = false;
    blk.tokens.clear();
  }
  hash_index_.clear();
  return dropped;
}

const std::vector<BlockId>& BlockAllocator::BlockTable(SeqId seq) const {
  static const std::vector<BlockId> kEmpty;
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? kEmpty : it->second.table;
}

int BlockAllocator::NumCommittedTokens(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.committed;
}

BlockAllocatorStats BlockAllocator::stats() const {
  BlockAllocatorStats s;
  s.num_blocks = num_blocks();
  s.used = num_used_;
  s.cached = lru_size_;
  s.free = NumFreeBlocks();
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  return s;
}

BlockId BlockAllocator::TakeFreshBlock() {
  BlockId b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    assert(lru_head_ != kNone && "TakeFreshBlock without CanAllocate");
    b = lru_head_;
    LruRemove(b);
    Unregister(b);
    ++evictions_;
  }
  blocks_[b].ref = 1;
  ++num_used_;
  return b;
}

void BlockAllocator::Release(BlockId b) {
  Block& blk = blocks_[b];
  assert(blk.ref > 0 && "double free of a KV block");
  if (--blk.ref > 0) return;
  --num_used_;
  if (blk.hashed) {
    LruPushBack(b);
  } else {
    free_.push_back(b);
  }
}

void BlockAllocator::Unregister(BlockId b) {
  Block& blk = blocks_[b];
  if (!blk.hashed) return;
  auto it = hash_index_.find(blk.hash);
  if (it != hash_index_.end() && it->second == b) hash_index_.erase(it);
  blk.hashed = false;
  blk.tokens.clear();
}

void BlockAllocator::LruRemove(BlockId b) {
  Block& blk = blocks_[b];
  if (blk.lru_prev != kNone) {
    blocks_[blk.lru_prev].lru_next = blk.lru_next;
  } else {
    lru_head_ = blk.lru_next;
  }
  if (blk.lru_next != kNone) {
    blocks_[blk.lru_next].lru_prev = blk.lru_prev;
  } else {
    lru_tail_ = blk.lru_prev;
  }
  blk.lru_prev = blk.lru_next = kNone;
  --lru_size_;
}

void BlockAllocator::LruPushBack(BlockId b) {
  Block& blk = blocks_[b];
  blk.lru_prev = lru_tail_;
  blk.lru_next = kNone;
  if (lru_tail_ != kNone) {
    blocks_[lru_tail_].lru_next = b;
  } else {
    lru_head_ = b;
  }
  lru_tail_ = b;
  ++lru_size_;
}

Status BlockAllocator::CheckInvariants() const {
  const int n = num_blocks();
  std::vector<int> refs(n, 0);
  for (const auto& [id, s] : seqs_) {
    std::vector<BlockId> sorted = s.table;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return InternalError("sequence {} holds a block twice", id);
    }
    for (BlockId b : s.table) {
      if (b < 0 || b >= n) return InternalError("sequence {} holds block {} out of range", id, b);
      ++refs[b];
    }
    if (s.committed > static_cast<int>(s.table.size()) * block_size_) {
      return InternalError("sequence {} committed {} tokens but holds {} blocks", id, s.committed,
                           s.table.size());
    }
    if (s.hashes.size() != static_cast<size_t>(s.committed / block_size_)) {
      return InternalError("sequence {} has {} block hashes for {} committed tokens", id, s.hashes.size(),
                           s.committed);
    }
    for (size_t i = 0; i < s.hashes.size(); ++i) {
      const Block& blk = blocks_[s.table[i]];
      if (blk.hashed && blk.hash != s.hashes[i]) {
        return InternalError("sequence {} block {} registered under another hash", id, s.table[i]);
      }
    }
  }
  // 0 = not seen, 1 = free list, 2 = LRU.
  std::vector<uint8_t> where(n, 0);
  for (BlockId b : free_) {
    if (b < 0 || b >= n) return InternalError("free list holds block {} out of range", b);
    if (where[b]) return InternalError("block {} twice on the free list", b);
    where[b] = 1;
  }
  int lru_count = 0;
  BlockId prev = kNone;
  for (BlockId b = lru_head_; b != kNone; b = blocks_[b].lru_next) {
    if (where[b]) return InternalError("block {} both free and cached (or an LRU cycle)", b);
    if (blocks_[b].lru_prev != prev) return InternalError("LRU back link broken at block {}", b);
    where[b] = 2;
    prev = b;
    ++lru_count;
  }
  if (prev != lru_tail_) return InternalError("LRU tail is {} but the list ends at {}", lru_tail_, prev);
  if (lru_count != lru_size_) return InternalError("LRU size {} but {} linked", lru_size_, lru_count);
  int used = 0;
  for (BlockId b = 0; b < n; ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref != refs[b])
      return InternalError("block {} ref {} but {} tables hold it", b, blk.ref, refs[b]);
    if (blk.ref > 0) {
      ++used;
      if (where[b]) return InternalError("block {} in use (ref {}) but also free/cached", b, blk.ref);
    } else if (where[b] == 0) {
      return InternalError("block {} leaked: ref 0, neither free nor cached", b);
    } else if ((where[b] == 2) != blk.hashed) {
      return InternalError("block {} hashed={} but on the {} list", b, blk.hashed,
                           where[b] == 2 ? "LRU" : "free");
    }
    if (blk.hashed) {
      auto it = hash_index_.find(blk.hash);
      if (it == hash_index_.end() || it->second != b)
        return InternalError("block {} hashed but not indexed", b);
      if (static_cast<int>(blk.tokens.size()) != block_size_) {
        return InternalError("cached block {} holds {} tokens", b, blk.tokens.size());
      }
    }
  }
  for (const auto& [h, b] : hash_index_) {
    if (!blocks_[b].hashed || blocks_[b].hash != h)
      return InternalError("hash index points at stale block {}", b);
  }
  if (used != num_used_) return InternalError("used count {} but {} blocks have refs", num_used_, used);
  if (num_used_ + lru_size_ + NumFreeBlocks() != n) {
    return InternalError("used {} + cached {} + free {} != {} blocks", num_used_, lru_size_, NumFreeBlocks(),
                         n);
  }
  return OkStatus();
}

}  // namespace stoke
