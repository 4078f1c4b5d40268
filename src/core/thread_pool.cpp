#include "core/thread_pool.h"

#include <algorithm>

namespace sparkserve {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t min_chunk) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int64_t threads = num_threads();
  // A few chunks per thread balance uneven work without much claiming overhead.
  int64_t chunk = std::max(min_chunk, (n + threads * 4 - 1) / (threads * 4));
  if (workers_.empty() || n <= chunk) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_ = 0;
  active_ = static_cast<int>(workers_.size());
  ++generation_;
  lock.unlock();
  work_cv_.notify_all();
  // The caller works too.
  for (;;) {
    lock.lock();
    int64_t begin = next_;
    next_ = std::min(job_n_, next_ + job_chunk_);
    int64_t end = next_;
    lock.unlock();
    if (begin >= end) break;
    fn(begin, end);
  }
  lock.lock();
  done_cv_.wait(lock, [this] { return active_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* fn = job_;
    for (;;) {
      int64_t begin = next_;
      next_ = std::min(job_n_, next_ + job_chunk_);
      int64_t end = next_;
      if (begin >= end) break;
      lock.unlock();
      (*fn)(begin, end);
      lock.lock();
    }
    if (--active_ == 0) done_cv_.notify_all();
  }
}

int default_thread_count() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace sparkserve
