#include "runtime/request.h"

namespace sparkserve {

void OutputChannel::push(EngineEvent e) {
  std::function<void()> on_push;
  {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(e));
    on_push = on_push_;
  }
  cv_.notify_one();
  if (on_push) on_push();
}

void OutputChannel::set_on_push(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_push_ = std::move(fn);
}

std::vector<EngineEvent> OutputChannel::pop_all(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !q_.empty(); });
  std::vector<EngineEvent> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
  q_.clear();
  return out;
}

}  // namespace sparkserve
