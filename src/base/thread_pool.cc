#include "base/thread_pool.h"

#include <algorithm>
#include <memory>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace stoke {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long a worker spins on new work before sleeping on the condition variable. Decode steps issue
// hundreds of 5-30 us loops back to back; a condition-variable wake costs about as much as the loop, so a
// short spin keeps the workers hot between them and costs nothing when the engine is idle.
constexpr int kSpinIterations = 20000;  // ~50-100 us of _mm_pause

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks() {
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= num_chunks_) return;
    const int64_t begin = c * chunk_;
    const int64_t end = std::min(n_, begin + chunk_);
    (*fn_)(begin, end);
    chunks_done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin first, then sleep.
    bool got = false;
    for (int i = 0; i < kSpinIterations; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen || stop_.load(std::memory_order_relaxed)) {
        got = true;
        break;
      }
      CpuRelax();
    }
    if (!got) {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
    }
    if (stop_.load()) return;
    seen = generation_.load();
    // Dekker-style handshake with ParallelFor: announce, then look. The caller closes the job, then waits
    // for active_ == 0, so a worker that sees job_open_ == true finds every job field written (acquire)
    // and the caller cannot return (and drop fn) while the worker is inside.
    active_.fetch_add(1);
    if (job_open_.load()) RunChunks();
    active_.fetch_sub(1);
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
  // A few chunks per thread balance uneven work without much contention.
  const int64_t target_chunks = std::min<int64_t>(max_chunks, int64_t{num_threads()} * 4);
  fn_ = &fn;
  n_ = n;
  chunk_ = (n + target_chunks - 1) / target_chunks;
  num_chunks_ = (n + chunk_ - 1) / chunk_;
  chunks_done_.store(0);
  next_chunk_.store(0);
  job_open_.store(true);  // publishes the fields above
  {
    std::lock_guard<std::mutex> lock(mu_);  // pairs with the sleepers' predicate check
    generation_.fetch_add(1);
  }
  work_cv_.notify_all();
  RunChunks();
  while (chunks_done_.load(std::memory_order_acquire) != num_chunks_) CpuRelax();
  job_open_.store(false);
  while (active_.load() != 0) CpuRelax();  // late workers leave RunChunks at once (no chunks left)
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

void ThreadPool::SetDefaultThreads(int num_threads) {
  DefaultThreads() = num_threads;
}

}  // namespace stoke
