// A small fixed pool of worker threads for data-parallel loops (the CPU backend splits output rows,
// heads or experts across cores). One parallel_for runs at a time; the calling thread takes part.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sparkserve {

class ThreadPool {
 public:
  // num_threads counts the calling thread: 1 = run everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), in parallel; returns when all are done.
  // Ranges hold at least min_chunk items (except the last), so tiny loops stay on one thread.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t next_ = 0;        // next unclaimed item
  int active_ = 0;          // workers still inside the current job
  uint64_t generation_ = 0; // bumps once per job so workers wake exactly once
  bool stop_ = false;
};

// Threads to use when the user does not say: the hardware concurrency (at least 1).
int default_thread_count();

}  // namespace sparkserve
