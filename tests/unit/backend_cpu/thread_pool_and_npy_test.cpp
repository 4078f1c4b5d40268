// The CPU backend's thread pool (every index exactly once, any thread count, back-to-back jobs) and
// the .npy writer used by `sparkserve logits` (header per NPY 1.0, round trip).
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "core/npy.h"
#include "core/thread_pool.h"

namespace sparkserve {
namespace {

TEST(ThreadPool, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 1000, 4097}) {
      for (int64_t min_chunk : {1, 16}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
          ASSERT_LE(0, b);
          ASSERT_LE(b, e);
          ASSERT_LE(e, n);
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        }, min_chunk);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
      }
    }
  }
}

TEST(ThreadPool, ManyJobsInARow) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 2000; ++rep)
    pool.parallel_for(10, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 20000);
}

TEST(Npy, HeaderFollowsTheNpy10Format) {
  std::string h = npy_header_f32({3, 1000});
  EXPECT_EQ(h.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(h.size() % 64, 0u);
  const size_t len = static_cast<uint8_t>(h[8]) | (static_cast<uint8_t>(h[9]) << 8);
  EXPECT_EQ(len + 10, h.size());
  EXPECT_EQ(h.back(), '\n');
  EXPECT_NE(h.find("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 1000), }"), std::string::npos);
  EXPECT_NE(npy_header_f32({5}).find("'shape': (5,)"), std::string::npos);  // 1-tuples keep the comma
}

TEST(Npy, RoundTrip) {
  auto path = std::filesystem::temp_directory_path() / ("sparkserve_npy_" + std::to_string(::getpid()) + ".npy");
  std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  ASSERT_TRUE(write_npy_f32(path, {2, 3}, v.data()).ok());
  auto r = read_npy_f32(path);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r->data, v);
  std::filesystem::remove(path);
  EXPECT_FALSE(write_npy_f32("/nonexistent/dir/x.npy", {1}, v.data()).ok());
  EXPECT_FALSE(read_npy_f32("/nonexistent/dir/x.npy").ok());
}

}  // namespace
}  // namespace sparkserve
