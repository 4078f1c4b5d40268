// Device memory of the CUDA backend: stream-ordered allocations from the device's default memory
// pool (cudaMallocAsync keeps freed blocks for reuse, so the model's per-op buffers cost no
// cudaMalloc after the first forward), copies, the per-forward layout upload and backend creation.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_stream.h"

namespace sparkserve {

void cuda_check(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "CUDA error: %s (%s) at %s:%d: %s\n", cudaGetErrorName(e), expr, file, line,
               cudaGetErrorString(e));
  std::abort();
}

cudaStream_t cuda_stream_of(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  return c ? c->stream() : nullptr;
}

bool weight_is_bf16(const Linear& w) {
  CHECK_MSG(w.format == WeightFormat::kBf16 || w.format == WeightFormat::kF32,
            "weight format not implemented by the CUDA backend");
  return w.format == WeightFormat::kBf16;
}

CudaBackend::CudaBackend(int device) : device_(device) {
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&main_stream_, cudaStreamNonBlocking));
  stream_ = main_stream_;
  // Keep freed pool memory instead of returning it to the driver at every synchronisation.
  cudaMemPool_t pool;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = UINT64_MAX;
  CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}

CudaBackend::~CudaBackend() {
  for (auto& l : layouts_) cudaFreeAsync(l.dev, stream_);
  cudaStreamSynchronize(stream_);
  for (auto& kv : inv_freq_) cudaFree(kv.second);
  cudaStreamSynchronize(stream_);
  for (auto& s : side_) {
    cudaStreamSynchronize(s.stream);
    cudaEventDestroy(s.done);
    cudaStreamDestroy(s.stream);
  }
  if (fork_) cudaEventDestroy(fork_);
  cudaStreamDestroy(main_stream_);
}

Tensor CudaBackend::alloc(DType dtype, std::vector<int64_t> shape) {
  Tensor t(nullptr, dtype, std::move(shape), Device::kCuda);
  size_t bytes = (t.nbytes() + 255) / 256 * 256;
  CUDA_CHECK(cudaMallocAsync(&t.data, bytes == 0 ? 256 : bytes, stream_));
  return t;
}

void CudaBackend::free(Tensor& t) {
  if (t.data) CUDA_CHECK(cudaFreeAsync(t.data, stream_));
  t.data = nullptr;
}

void CudaBackend::upload(const Tensor& dst, const void* host_src) {
  CHECK_MSG(!capturing_, "upload while recording a CUDA graph");
  if (dst.nbytes() == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst.data, host_src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
  // The caller may free host_src on return; uploads are rare (weights, ids and positions once per
  // forward), so a synchronisation costs nothing that matters.
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::download(void* host_dst, const Tensor& src) {
  CHECK_MSG(!capturing_, "download while recording a CUDA graph");
  if (src.nbytes() == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(host_dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::fill_zero(const Tensor& t) {
  if (t.nbytes() == 0) return;
  CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), stream_));
}

void CudaBackend::synchronize() {
  CHECK_MSG(!capturing_, "synchronize while recording a CUDA graph");
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void* CudaBackend::alloc_host_staging(size_t bytes) {
  // Page-locked: the copy engine reads it directly (pageable memory is first copied by the driver
  // through its own small pinned bounce buffers). A failure (e.g. a locked-memory limit) falls back
  // to heap memory in the loader.
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

void CudaBackend::free_host_staging(void* p) {
  if (p) CUDA_CHECK(cudaFreeHost(p));
}

CudaBackend::Scratch::Scratch(CudaBackend* o, size_t bytes) : owner(o) {
  CUDA_CHECK(cudaMallocAsync(&ptr, bytes == 0 ? 256 : bytes, o->stream()));
}
CudaBackend::Scratch::~Scratch() {
  if (ptr) CUDA_CHECK(cudaFreeAsync(ptr, owner->stream()));
}

CudaBackend::Scratch CudaBackend::upload_scratch(const void* host, size_t bytes) {
  // A recorded copy would read `host` again at every replay, long after it is gone.
  CHECK_MSG(!capturing_, "host array uploaded while recording a CUDA graph");
  Scratch s(this, bytes);
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so `host` may go away.
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(s.ptr, host, bytes, cudaMemcpyHostToDevice, stream_));
  return s;
}

DeviceLayout CudaBackend::device_layout(const BatchLayout& batch) {
  const int32_t S = static_cast<int32_t>(batch.seqs.size());
  const int32_t R = static_cast<int32_t>(batch.total_rows);
  for (const FixedLayout& f : fixed_layouts_) {
    if (S != f.layout.num_seqs || R != f.layout.total_rows) continue;
    bool fits = true;
    for (const SeqSpan& sp : batch.seqs) fits = fits && sp.num_blocks <= f.max_blocks;
    if (!fits) continue;
    std::vector<int32_t> words(f.words.size());
    pack_layout(batch, f.max_blocks, words.data());
    if (words == f.words) return f.layout;
  }
  CHECK_MSG(!capturing_, "a state op's layout is not a fixed layout while recording a CUDA graph");
  std::vector<int32_t> host(static_cast<size_t>(6 * S + R), 0);
  int32_t max_tokens = 0, max_len = 0, offset = 0;
  std::fill(host.begin() + 6 * S, host.end(), -1);
  for (int32_t s = 0; s < S; ++s) {
    const SeqSpan& sp = batch.seqs[static_cast<size_t>(s)];
    CHECK(sp.row_begin >= 0 && sp.num_tokens >= 0 && sp.row_begin + sp.num_tokens <= R);
    host[static_cast<size_t>(s)] = static_cast<int32_t>(sp.row_begin);
    host[static_cast<size_t>(S + s)] = static_cast<int32_t>(sp.num_tokens);
    host[static_cast<size_t>(2 * S + s)] = static_cast<int32_t>(sp.start_pos);
    host[static_cast<size_t>(3 * S + s)] = sp.gdn_slot;
    host[static_cast<size_t>(4 * S + s)] = offset;
    host[static_cast<size_t>(5 * S + s)] = static_cast<int32_t>(sp.num_blocks);
    for (int64_t i = 0; i < sp.num_tokens; ++i) host[static_cast<size_t>(6 * S + sp.row_begin + i)] = s;
    for (int64_t b = 0; b < sp.num_blocks; ++b) host.push_back(sp.block_table[b]);
    offset += static_cast<int32_t>(sp.num_blocks);
    max_tokens = std::max<int32_t>(max_tokens, static_cast<int32_t>(sp.num_tokens));
    max_len = std::max<int32_t>(max_len, static_cast<int32_t>(sp.start_pos + sp.num_tokens));
  }
  // GDN state saves, when a span has any: S + 1 running counts, then (tokens, row) pairs.
  int32_t saves_at = -1;
  if (std::any_of(batch.seqs.begin(), batch.seqs.end(), [](const SeqSpan& sp) { return sp.num_saves > 0; })) {
    saves_at = static_cast<int32_t>(host.size());
    int32_t count = 0;
    host.push_back(0);
    for (const SeqSpan& sp : batch.seqs) host.push_back(count += static_cast<int32_t>(sp.num_saves));
    for (const SeqSpan& sp : batch.seqs)
      for (int64_t i = 0; i < sp.num_saves; ++i) {
        const GdnStateSave& v = sp.saves[i];
        CHECK(v.tokens >= 1 && v.tokens <= sp.num_tokens);
        host.push_back(static_cast<int32_t>(v.tokens));
        host.push_back(v.row);
      }
  }
  ++use_clock_;
  for (auto& c : layouts_)
    if (c.host == host) {
      c.last_use = use_clock_;
      return c.layout;
    }
  // Replace the least recently used of a few entries: every layer of a forward asks again for its
  // layouts (all spans, stateful, prefill, decode, verify).
  constexpr size_t kCacheEntries = 8;
  CachedLayout* slot = nullptr;
  if (layouts_.size() < kCacheEntries) {
    layouts_.emplace_back();
    slot = &layouts_.back();
  } else {
    slot = &layouts_[0];
    for (auto& c : layouts_)
      if (c.last_use < slot->last_use) slot = &c;
    CUDA_CHECK(cudaFreeAsync(slot->dev, stream_));
  }
  slot->host = std::move(host);
  slot->last_use = use_clock_;
  const size_t bytes = slot->host.size() * sizeof(int32_t);
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&slot->dev), bytes == 0 ? 256 : bytes, stream_));
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(slot->dev, slot->host.data(), bytes, cudaMemcpyHostToDevice, stream_));
  slot->layout.base = slot->dev;
  slot->layout.num_seqs = S;
  slot->layout.total_rows = R;
  slot->layout.max_tokens = max_tokens;
  slot->layout.max_len = max_len;
  slot->layout.saves_at = saves_at;
  return slot->layout;
}

const float* CudaBackend::rope_inv_freq(int64_t rotary_dim, double theta) {
  auto key = std::make_pair(rotary_dim, theta);
  auto it = inv_freq_.find(key);
  if (it != inv_freq_.end()) return it->second;
  const int64_t half = rotary_dim / 2;
  // The CPU backend's formula, evaluated with the same host pow so positions up to 2^24 give
  // bit-identical angles.
  std::vector<float> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] =
        1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
  float* dev = nullptr;
  CUDA_CHECK(cudaMalloc(&dev, std::max<size_t>(f.size() * 4, 4)));
  CUDA_CHECK(cudaMemcpy(dev, f.data(), f.size() * 4, cudaMemcpyHostToDevice));
  inv_freq_[key] = dev;
  return dev;
}

int64_t cuda_pool_peak_bytes() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t high = 0, graph_high = 0;
  CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  // Buffers allocated inside recorded CUDA graphs live in a separate graph memory pool; the sum of
  // the two high-water marks bounds what was held at once.
  CUDA_CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &graph_high));
  return static_cast<int64_t>(high + graph_high);
}

Expected<std::unique_ptr<Backend>> make_cuda_backend_on(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::string why = e != cudaSuccess ? std::string(cudaGetErrorString(e)) : "no devices";
    cudaGetLastError();
    return make_error("no CUDA device (" + why + ")");
  }
  if (device < 0 || device >= count)
    return make_error("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                      " present)");
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(device));
}

}  // namespace sparkserve
