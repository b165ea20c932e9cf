#include "engine/image_cuda/resize_normalize.h"

#include "engine/image_cuda/resize_kernel.h"
#include "kernels/cuda/cuda_check.h"

namespace stoke::image::cuda {

Status ResizeNormalizeNchw(const uint8_t* rgb, int64_t width, int64_t height, const PreprocessConfig& cfg,
                           float* out, cudaStream_t stream) {
  if (width < 1 || height < 1) return InvalidArgumentError("resize: empty image ({}x{})", width, height);
  RETURN_IF_ERROR(cfg.Validate());
  const ResizeGeometry g = Geometry(width, height, cfg);
  ResizeKernelParams p;
  p.src_w = width;
  p.src_h = height;
  p.out_h = cfg.height;
  p.out_w = cfg.width;
  p.scaled_h = g.scaled_h;
  p.scaled_w = g.scaled_w;
  p.y0 = g.y0;
  p.x0 = g.x0;
  p.rows = g.rows;
  p.cols = g.cols;
  for (int c = 0; c < 3; ++c) {
    p.mul[c] = cfg.scale / cfg.std[c];
    p.add[c] = -cfg.mean[c] / cfg.std[c];
  }
  p.bgr = cfg.channel_order == "bgr" ? 1 : 0;
  CUDA_RETURN_IF_ERROR(LaunchResizeNormalize(rgb, p, out, stream));
  return OkStatus();
}

}  // namespace stoke::image::cuda
