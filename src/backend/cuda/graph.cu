// CUDA graphs: a forward pass captured from the backend's stream once and replayed as one launch
// (Qwen35Model records a decode step per batch size; docs/performance.md "CUDA graphs (cudag)").
// Buffers the ops allocate while recording become graph memory nodes (allocated and freed inside
// the graph); the layout the state ops read sits at a fixed device address, refreshed by the caller
// before each replay (pack_layout / set_fixed_layout).
#include <algorithm>
#include <cstdio>

#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {
namespace {

class CudaRecording final : public Recording {
 public:
  CudaRecording(cudaGraphExec_t exec, cudaStream_t stream, int64_t kernels)
      : exec_(exec), stream_(stream), kernels_(kernels) {}
  int64_t kernel_nodes() const override { return kernels_; }
  ~CudaRecording() override {
    // A replay still queued keeps using the graph's memory: let it finish first.
    cudaStreamSynchronize(stream_);
    cudaGraphExecDestroy(exec_);
  }
  void replay() override { CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  int64_t kernels_;
};

}  // namespace

std::unique_ptr<Recording> CudaBackend::record(const std::function<void()>& body) {
  CHECK_MSG(!capturing_, "CudaBackend::record does not nest");
  // Thread-local mode: an unsafe call (cudaMalloc, a synchronous copy) from this thread fails the
  // capture instead of silently running outside it; other threads are not affected.
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  body();
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(stream_, &graph);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "sparkserve: CUDA graph capture failed (%s); running ops one by one\n",
                 cudaGetErrorString(e));
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    return nullptr;
  }
  // Kernel nodes: what a replay pays a kernel boundary for (docs/performance.md).
  int64_t kernels = 0;
  size_t num_nodes = 0;
  if (cudaGraphGetNodes(graph, nullptr, &num_nodes) == cudaSuccess && num_nodes > 0) {
    std::vector<cudaGraphNode_t> nodes(num_nodes);
    if (cudaGraphGetNodes(graph, nodes.data(), &num_nodes) == cudaSuccess)
      for (size_t i = 0; i < num_nodes; ++i) {
        cudaGraphNodeType t;
        if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeKernel) ++kernels;
      }
  }
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    std::fprintf(stderr, "sparkserve: CUDA graph instantiation failed (%s); running ops one by one\n",
                 cudaGetErrorString(e));
    cudaGetLastError();
    return nullptr;
  }
  // Upload once now so the first replay does not pay for it.
  CUDA_CHECK(cudaGraphUpload(exec, stream_));
  return std::make_unique<CudaRecording>(exec, stream_, kernels);
}

int64_t CudaBackend::layout_words(int64_t spans, int64_t rows, int64_t max_blocks) const {
  return 6 * spans + rows + spans * max_blocks;
}

// DeviceLayout's format (cuda_backend.h) with span s's block table at offset s * max_blocks.
void CudaBackend::pack_layout(const BatchLayout& batch, int64_t max_blocks, int32_t* words) const {
  const int64_t S = static_cast<int64_t>(batch.seqs.size()), R = batch.total_rows;
  for (int64_t r = 0; r < R; ++r) words[6 * S + r] = -1;
  int32_t* tables = words + 6 * S + R;
  for (int64_t s = 0; s < S; ++s) {
    const SeqSpan& sp = batch.seqs[static_cast<size_t>(s)];
    CHECK(sp.row_begin >= 0 && sp.num_tokens >= 0 && sp.row_begin + sp.num_tokens <= R);
    CHECK_MSG(sp.num_blocks <= max_blocks, "pack_layout: a span has more KV blocks than the layout holds");
    words[s] = static_cast<int32_t>(sp.row_begin);
    words[S + s] = static_cast<int32_t>(sp.num_tokens);
    words[2 * S + s] = static_cast<int32_t>(sp.start_pos);
    words[3 * S + s] = sp.gdn_slot;
    words[4 * S + s] = static_cast<int32_t>(s * max_blocks);
    words[5 * S + s] = static_cast<int32_t>(sp.num_blocks);
    for (int64_t i = 0; i < sp.num_tokens; ++i) words[6 * S + sp.row_begin + i] = static_cast<int32_t>(s);
    int32_t* table = tables + s * max_blocks;
    for (int64_t b = 0; b < sp.num_blocks; ++b) table[b] = sp.block_table[b];
    // Unused entries: never read (kernels stop at num_blocks), zeroed so the buffer is deterministic.
    for (int64_t b = sp.num_blocks; b < max_blocks; ++b) table[b] = 0;
  }
}

void CudaBackend::set_fixed_layout(const Tensor& words, const BatchLayout& batch, int64_t max_blocks,
                                   int64_t max_len) {
  const int64_t S = static_cast<int64_t>(batch.seqs.size()), R = batch.total_rows;
  CHECK(words.dtype == DType::kI32 && words.numel() >= layout_words(S, R, max_blocks));
  FixedLayout f;
  f.words.resize(static_cast<size_t>(layout_words(S, R, max_blocks)));
  pack_layout(batch, max_blocks, f.words.data());
  f.max_blocks = max_blocks;
  f.layout.base = words.ptr<const int32_t>();
  f.layout.num_seqs = static_cast<int32_t>(S);
  f.layout.total_rows = static_cast<int32_t>(R);
  // Host-side grid hints must cover every step replayed: the longest span (the same in every batch
  // replayed, so kernel choices that depend on it are those of the step run op by op), and the
  // caller's bound on the sequence length.
  int64_t longest = 0;
  for (const SeqSpan& sp : batch.seqs) longest = std::max(longest, sp.num_tokens);
  f.layout.max_tokens = static_cast<int32_t>(longest);
  f.layout.max_len = static_cast<int32_t>(max_len);
  fixed_layouts_.push_back(std::move(f));
}

}  // namespace sparkserve
