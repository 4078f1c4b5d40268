// Backend::copy on the device against the CPU backend, on the shapes the prefix cache copies: GDN
// state rows (a snapshot save / restore: conv [rows, conv_dim, K-1] and recurrent
// [rows, Hv, dk, dv] pools, row to row within one pool) and KV blocks ([blocks, block_size, kvh,
// hd], block to block). A copy moves bytes, so the bound is exact equality; the rows around the
// destination must stay as they were (a copy that writes past its row fails there).
#include "gpu_harness.h"

namespace sparkserve {
namespace {

// Copies row src to row dst of a [rows, ...] f32 pool on both backends and compares the whole pool.
void check_row_copy(Harness& h, const std::string& name, std::vector<int64_t> shape, int64_t src, int64_t dst) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Pair pool = h.f32(shape, randn(n));
  h.cpu->copy(pool.cpu().rows(dst, 1), pool.cpu().rows(src, 1));
  h.gpu->copy(pool.gpu().rows(dst, 1), pool.gpu().rows(src, 1));
  std::vector<float> got = h.gpu_f(pool), ref = h.cpu_f(pool);
  const int64_t row = n / shape[0];
  bool moved = true;  // the destination now equals the source (not just "both backends agree")
  for (int64_t i = 0; i < row; ++i) moved = moved && ref[static_cast<size_t>(dst * row + i)] == ref[static_cast<size_t>(src * row + i)];
  record("state_copy", name, moved ? rel_err(got, ref) : INFINITY, kExact);
}

void run(Harness& h) {
  // Qwen3.5-35B-A3B GDN layer: conv_dim 8192, K-1 = 3; Hv 32, dk = dv = 128; 6 rows (live + snapshots).
  check_row_copy(h, "conv_row_save_8192x3", {6, 8192, 3}, 1, 4);
  check_row_copy(h, "recurrent_row_save_32x128x128", {6, 32, 128, 128}, 2, 5);
  check_row_copy(h, "recurrent_row_restore_32x128x128", {6, 32, 128, 128}, 5, 0);
  // KV blocks of 16 positions, 2 kv heads of 256 (35B-A3B), copy-on-write of a shared tail block.
  check_row_copy(h, "kv_block_16x2x256", {8, 16, 2, 256}, 7, 3);
  // The tiny fixture's shapes (odd sizes).
  check_row_copy(h, "recurrent_row_tiny_4x32x32", {3, 4, 32, 32}, 0, 2);
}

RegisterOpChecks reg("state_copy", run);

}  // namespace
}  // namespace sparkserve
