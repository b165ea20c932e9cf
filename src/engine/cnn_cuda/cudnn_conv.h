// The CNN executor's cuDNN convolutions (--conv-backend cudnn|auto, cuda_cnn.h): one conv step's descriptors
// (NHWC activations, KRSC filter, fp32 accumulation on tensor cores), the algorithm cuDNN measures once per
// geometry, and the run with bias + ReLU fused where cuDNN takes them. Built with cuDNN when CMake finds it
// (STOKE_WITH_CUDNN); without it CudnnInBuild() (cuda_cnn.h) is false and CudnnConvs::Create says why.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "base/status.h"
#include "engine/cnn_cuda/cnn_kernels.h"
#include "kernels/cpu/conv.h"

namespace stoke::cnn::cuda {

// One conv step's cuDNN setup (opaque outside cudnn_conv.cc).
struct CudnnConvStep;
struct CudnnConvStepDeleter {
  void operator()(CudnnConvStep* s) const;
};
using CudnnConvStepPtr = std::unique_ptr<CudnnConvStep, CudnnConvStepDeleter>;

// What a run left for the caller's bias + activation pass.
struct CudnnConvDone {
  bool bias = false;  // the bias was added (the fused call)
  bool relu = false;  // and ReLU applied (the step's activation is ReLU)
};

// The cuDNN handle of one runner (on its stream), the algorithm chosen per conv geometry, and the workspace
// the largest prepared step asked for. Not thread-safe (one per runner, as the stream).
class CudnnConvs {
 public:
  static StatusOr<std::unique_ptr<CudnnConvs>> Create(cudaStream_t stream);
  ~CudnnConvs();
  CudnnConvs(const CudnnConvs&) = delete;
  CudnnConvs& operator=(const CudnnConvs&) = delete;

  // Descriptors and algorithm for conv `c` in 16-bit `elem` with ReLU fused when `relu`; null when cuDNN has
  // no algorithm for it or the plan's padding is asymmetric in a way cuDNN cannot express (that step runs
  // im2col + GEMM). Grows the workspace.
  StatusOr<CudnnConvStepPtr> Prepare(const cpu::Conv2dShape& c, bool relu, ElemType elem);

  // y = conv(x, w) on the stream, with w [out_c, kernel_h, kernel_w, in_c / groups] and, when the fused call
  // is taken, + bias16 (the bias in the 16-bit type) and ReLU. The result says what is left to do.
  StatusOr<CudnnConvDone> Run(const CudnnConvStep& step, const void* x, const void* w, const void* bias16,
                              void* y);

 private:
  struct Impl;
  explicit CudnnConvs(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoke::cnn::cuda
