// 2-D tensor maps for the copy engine's tensor copies (cp.async.bulk.tensor, sm_90+): a row-major
// [rows, cols] array read in boxes of [box_rows, box_cols] elements. Encoded on the host through the
// runtime's driver entry point (no link against libcuda); passed to kernels as __grid_constant__
// parameters, so graph-captured launches keep them.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace sparkserve {

// Whether the driver offers the encoder (false: kernels that need a map do not take the case).
bool tensor_maps_available();

// p: [rows, cols] elements of elem_bytes with row stride ld elements; rows and columns past the end
// read as zeros. CHECK-fails if the driver refuses the layout (callers check the alignment rules:
// p and ld·elem_bytes multiples of 16, box_cols·elem_bytes a multiple of 16, boxes of at most 256).
// l2: how far the L2 extends each row's request (256 bytes suits boxes whose next columns the next
// copies read soon; none, data read once in narrow boxes that L2 would otherwise fetch twice).
CUtensorMap tensor_map_2d(const void* p, CUtensorMapDataType type, int elem_bytes, int64_t rows, int64_t cols,
                          int64_t ld, int box_rows, int box_cols, CUtensorMapSwizzle swizzle,
                          CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B);

}  // namespace sparkserve
