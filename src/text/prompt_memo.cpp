#include "text/prompt_memo.h"

#include <algorithm>
#include <cstring>

namespace sparkserve {

size_t common_prefix_length(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  // Whole blocks by memcmp (vectorised), then the differing block byte by byte.
  constexpr size_t kBlock = 256;
  size_t i = 0;
  while (i + kBlock <= n && std::memcmp(a.data() + i, b.data() + i, kBlock) == 0) i += kBlock;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

PromptMemo::Found PromptMemo::find(std::string_view text) const {
  std::deque<std::shared_ptr<const Entry>> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries = entries_;
  }
  Found best;
  for (const auto& e : entries) {
    const size_t common = common_prefix_length(text, e->text);
    auto it = std::upper_bound(e->points.begin(), e->points.end(), common,
                               [](size_t c, const ResumePoint& p) { return c < p.needs; });
    if (it == e->points.begin()) continue;
    const ResumePoint* p = &*(it - 1);
    if (!best.point || p->num_ids > best.point->num_ids) best = {e, p};
  }
  if (best.point) resumes_.fetch_add(1);
  return best;
}

void PromptMemo::add(std::shared_ptr<const Entry> entry) {
  if (max_entries_ == 0 || entry->text.size() > max_text_bytes_) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(entries_, [&](const std::shared_ptr<const Entry>& e) { return e->text == entry->text; });
  entries_.push_front(std::move(entry));
  while (entries_.size() > max_entries_) entries_.pop_back();
}

}  // namespace sparkserve
