#include "base/thread_pool.h"

#include <algorithm>
#include <memory>

namespace stoke {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  for (;;) {
    int64_t c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_chunk_ >= num_chunks_) return;
      c = next_chunk_++;
    }
    const int64_t begin = c * chunk_;
    const int64_t end = std::min(n_, begin + chunk_);
    (*fn_)(begin, end);
    bool all_done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all_done = ++chunks_done_ == num_chunks_;
    }
    if (all_done) done_cv_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunChunks();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  if (workers_.empty() || max_chunks <= 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  // A few chunks per thread balance uneven work without much locking.
  const int64_t target_chunks = std::min<int64_t>(max_chunks, int64_t{num_threads()} * 4);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = (n + target_chunks - 1) / target_chunks;
    num_chunks_ = (n + chunk_ - 1) / chunk_;
    next_chunk_ = 0;
    chunks_done_ = 0;
    ++generation_;
  }
  work_cv_.notify_all();
  RunChunks();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return chunks_done_ == num_chunks_; });
  fn_ = nullptr;
}

namespace {
std::unique_ptr<ThreadPool>& DefaultSlot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
int& DefaultThreads() {
  static int n = 0;
  return n;
}
}  // namespace

ThreadPool& ThreadPool::Default() {
  static std::once_flag once;
  std::call_once(once, [] { DefaultSlot() = std::make_unique<ThreadPool>(DefaultThreads()); });
  return *DefaultSlot();
}

void ThreadPool::SetDefaultThreads(int num_threads) { DefaultThreads() = num_threads; }

}  // namespace stoke
