// tensor_map.h: cuTensorMapEncodeTiled resolved once through cudaGetDriverEntryPointByVersion.
#include "backend/cuda/tensor_map.h"

#include <cuda_runtime_api.h>

#include "core/check.h"

namespace sparkserve {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

}  // namespace

bool tensor_maps_available() { return encode_tiled() != nullptr; }

CUtensorMap tensor_map_2d(const void* p, CUtensorMapDataType type, int elem_bytes, int64_t rows, int64_t cols,
                          int64_t ld, int box_rows, int box_cols, CUtensorMapSwizzle swizzle,
                          CUtensorMapL2promotion l2) {
  CHECK_MSG(encode_tiled(), "tensor_map_2d: the driver has no cuTensorMapEncodeTiled");
  CUtensorMap m{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * elem_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&m, type, 2, const_cast<void*>(p), dims, strides, box, elem_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, l2,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CHECK_MSG(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed");
  return m;
}

}  // namespace sparkserve
