// A fixed set of threads running queued tasks in FIFO order: the HTTP server's workers, where
// request handlers (JSON parsing, chat templates, tokenizing) and response producers run, so
// that none of that work ever runs on an I/O thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sparkserve::http {

class TaskPool {
 public:
  explicit TaskPool(int num_threads);
  ~TaskPool();  // finishes the queued tasks, then joins
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void post(std::function<void()> task);
  size_t queued() const;

 private:
  void loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace sparkserve::http
