// Backend::copy on the device against the CPU backend, on the shapes the prefix cache copies: GDN
// state rows (a snapshot save / restore: conv [rows, conv_dim, K-1] and recurrent
// [rows, Hv, dk, dv] pools, row to row within one pool) and KV blocks ([blocks, block_size, kvh,
// hd], block to block), one copy at a time and as one Backend::copy_batch of a whole snapshot restore.
// A copy moves bytes, so the bound is exact equality; the rows around the destination must stay as
// they were (a copy that writes past its row fails there).
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

// One copy_batch over many pools at once, on fresh random data: row src -> row dst of every pool
// (a snapshot restore or save touches every layer's pools), and row dst -> row src + 1 of every
// pool as well (sources shared with the first copies). Whole pools compared with the CPU backend.
void check_batch(Harness& h, const std::string& name, const std::vector<std::vector<int64_t>>& shapes, int64_t src,
                 int64_t dst) {
  std::vector<Pair> pools;
  std::vector<TensorCopy> cpu_copies, gpu_copies;
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    pools.push_back(h.f32(shape, randn(n)));
  }
  for (const Pair& p : pools)
    for (const auto& [from, to] : {std::pair{src, dst}, std::pair{src, src + 1}}) {
      cpu_copies.push_back({p.cpu().rows(to, 1), p.cpu().rows(from, 1)});
      gpu_copies.push_back({p.gpu().rows(to, 1), p.gpu().rows(from, 1)});
    }
  h.cpu->copy_batch(cpu_copies);
  h.gpu->copy_batch(gpu_copies);
  std::vector<float> got, ref;
  bool moved = true;
  for (const Pair& p : pools) {
    std::vector<float> g = h.gpu_f(p), r = h.cpu_f(p);
    const int64_t row = static_cast<int64_t>(r.size()) / p.shape[0];
    for (int64_t i = 0; i < row; ++i)
      moved = moved && r[static_cast<size_t>(dst * row + i)] == r[static_cast<size_t>(src * row + i)] &&
              r[static_cast<size_t>((src + 1) * row + i)] == r[static_cast<size_t>(src * row + i)];
    got.insert(got.end(), g.begin(), g.end());
    ref.insert(ref.end(), r.begin(), r.end());
  }
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
  // A restore of 8 of 35B-A3B's GDN layers (conv and recurrent rows) and 10 attention layers' K, V
  // and fp8 scale blocks (112 copies, one launch); then 70 pools of 84-byte rows and 3 of 32,772-byte
  // rows (row starts off 16-byte alignment: the byte path, over two 32 KB chunks) and 3 of
  // 32,784-byte rows (16-byte path, a short second chunk): 152 copies, two launches of at most 128.
  std::vector<std::vector<int64_t>> restore;
  for (int l = 0; l < 8; ++l) {
    restore.push_back({6, 8192, 3});
    restore.push_back({6, 32, 128, 128});
  }
  for (int l = 0; l < 10; ++l)
    for (const auto& s : {std::vector<int64_t>{6, 16, 2, 256}, std::vector<int64_t>{6, 16, 2, 256},
                          std::vector<int64_t>{6, 16, 2}, std::vector<int64_t>{6, 16, 2}})
      restore.push_back(s);
  check_batch(h, "batch_restore_8gdn_10attn", restore, 3, 0);
  std::vector<std::vector<int64_t>> odd(70, std::vector<int64_t>{5, 3, 7});
  for (int i = 0; i < 3; ++i) odd.push_back({4, 8193});
  for (int i = 0; i < 3; ++i) odd.push_back({4, 8196});
  check_batch(h, "batch_unaligned_152_copies", odd, 1, 3);
}

RegisterOpChecks reg("state_copy", run);

}  // namespace
}  // namespace sparkserve
