// The CNN engine on one CUDA GPU: the CPU's graph and plan (engine/cnn/: folded, fused, planned per input
// shape), run by another executor. Weights are uploaded once per model (fp16 or bf16; BatchNorm already
// folded into the convolutions); activations stay on the device between steps, NHWC for images as on the CPU,
// in the plan's own buffers (reused after a value's last reader).
//
//   step                 on the GPU
//   conv (general)       conv_backend cudnn (auto: from a batch of 32 images, when the build has cuDNN; below
//                        that im2col, measured faster at small batches): cuDNN on the NHWC
//                        activation with KRSC weights, the algorithm measured once per shape
//                        (cudnnFindConvolutionForwardAlgorithm), bias + ReLU fused into the call
//                        (cudnnConvolutionBiasActivationForward); other activations ours after it.
//                        conv_backend im2col: im2col (ours) + cuBLAS GEMM (tensor cores, fp32 accumulation),
//                        one per group (strided batched), then bias + activation (ours, in place)
//   conv 1x1, stride 1   im2col backend: the GEMM straight on the NHWC activation (no im2col)
//   conv depthwise       a direct kernel with bias + activation fused
//   add/sub/mul/div      a broadcasting kernel; an activation right after it (ResNet's add + ReLU) is fused
//   pools, softmax, ...  one kernel each (cnn_kernels.h)
//   gemm                 cuBLAS + bias + activation
//
// Input: the FP32 NCHW batch from the host (Run), or decoded RGB8 images resized and normalised on the
// device (RunImages, engine/image_cuda/). Output: the first graph output as FP32 on the host.
#pragma once

#include <memory>
#include <string>

#include "engine/cnn/cnn_model.h"
#include "engine/model/cnn_backend.h"

namespace stoke::cnn::cuda {

// Uploads the model's weights to options.gpu_index. InvalidArgument for an unknown precision;
// FailedPrecondition when no GPU is visible; errors from CUDA as Status.
StatusOr<std::shared_ptr<CnnDeviceModel>> CreateCudaCnnModel(std::shared_ptr<const CnnModel> model,
                                                             const CnnDeviceOptions& options);

// Whether this build has the cuDNN conv path (CMake found cuDNN: STOKE_WITH_CUDNN).
bool CudnnInBuild();

// For Backends::cuda_cnn (engine/cuda/cuda_backends.cc).
CnnBackend CudaCnnBackend();

}  // namespace stoke::cnn::cuda
