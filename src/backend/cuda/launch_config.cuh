// Launch configurations for cudaLaunchKernelEx with programmatic stream serialization: the kernel may
// start under the tail of the kernel before it on the stream (it waits for that kernel's results at
// griddepcontrol.wait, pdl_wait), optionally as thread-block clusters along x.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sparkserve {

// cfg points into attrs: neither copied nor moved (a function may still return one by value).
// With a cluster, attrs[0] is its shape (numAttrs = 1 leaves the cluster shape only, for occupancy
// queries), attrs[1] the serialization.
struct PdlLaunch {
  cudaLaunchAttribute attrs[2] = {};
  cudaLaunchConfig_t cfg = {};

  // cluster_x > 0: clusters of cluster_x blocks along x (the grid's x must be a multiple of it).
  PdlLaunch(dim3 grid, dim3 block, int64_t smem, cudaStream_t stream, unsigned cluster_x = 0) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.stream = stream;
    int n = 0;
    if (cluster_x > 0) {
      attrs[n].id = cudaLaunchAttributeClusterDimension;
      attrs[n].val.clusterDim.x = cluster_x;
      attrs[n].val.clusterDim.y = 1;
      attrs[n].val.clusterDim.z = 1;
      ++n;
    }
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attrs;
    cfg.numAttrs = n + 1;
  }
  PdlLaunch(const PdlLaunch&) = delete;
  PdlLaunch& operator=(const PdlLaunch&) = delete;
};

}  // namespace sparkserve
