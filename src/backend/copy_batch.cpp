// Backend::copy_batch's precondition and the single copy built on it.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "core/check.h"

namespace sparkserve {

void check_copy_batch(const std::vector<TensorCopy>& copies) {
  struct Range {
    uintptr_t begin, end;
    bool dst;
  };
  std::vector<Range> ranges;
  ranges.reserve(2 * copies.size());
  for (const TensorCopy& c : copies) {
    CHECK(c.dst.dtype == c.src.dtype && c.dst.numel() == c.src.numel());
    const size_t n = c.dst.nbytes();
    if (n == 0) continue;
    const auto d = reinterpret_cast<uintptr_t>(c.dst.data), s = reinterpret_cast<uintptr_t>(c.src.data);
    ranges.push_back({d, d + n, true});
    ranges.push_back({s, s + n, false});
  }
  // In start order, a range overlaps an earlier one exactly when it starts before that one's end:
  // no range may start inside an earlier destination, and no destination inside any earlier range.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  uintptr_t dst_end = 0, any_end = 0;
  for (const Range& r : ranges) {
    CHECK_MSG(r.begin >= dst_end && (!r.dst || r.begin >= any_end),
              "copy_batch: a destination overlaps a source or another destination");
    if (r.dst) dst_end = std::max(dst_end, r.end);
    any_end = std::max(any_end, r.end);
  }
}

void Backend::copy(const Tensor& dst, const Tensor& src) {
  copy_batch({TensorCopy{dst, src}});
}

}  // namespace sparkserve
