// A fixed pool of worker threads for data-parallel loops in the CPU kernels. The calling thread takes part,
// so a pool of N threads uses N-1 workers plus the caller. ParallelFor blocks until every chunk is done.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace stoke {

class ThreadPool {
 public:
  // num_threads <= 0: one per hardware thread.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint sub-ranges covering [0, n), each at least `grain` long (except the
  // last). Runs inline when n is small or the pool has one thread. Not reentrant: do not call from inside fn.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool the CPU engine uses (sized by SetDefaultThreads, default: hardware threads).
  static ThreadPool& Default();
  static void SetDefaultThreads(int num_threads);

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;  // only for sleeping workers
  std::condition_variable work_cv_;
  std::atomic<uint64_t> generation_{0};  // bumped per ParallelFor; workers wake on change
  std::atomic<bool> stop_{false};
  std::atomic<int> active_{0};         // workers between announcing themselves and leaving the job
  std::atomic<bool> job_open_{false};  // fields below are valid while true
  // Current job; written by the caller only while the job is closed and no worker is active.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  int64_t num_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int64_t> chunks_done_{0};
  std::mutex call_mu_;  // serialises concurrent ParallelFor callers
};

}  // namespace stoke
