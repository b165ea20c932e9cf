#include "engine/cnn_cuda/cudnn_conv.h"

#include <array>
#include <climits>
#include <map>

#include "engine/cnn_cuda/cuda_cnn.h"
#include "engine/cnn_cuda/device_memory.h"

#ifdef STOKE_WITH_CUDNN
#include <cudnn.h>
#endif

namespace stoke::cnn::cuda {

bool CudnnInBuild() {
#ifdef STOKE_WITH_CUDNN
  return true;
#else
  return false;
#endif
}

#ifdef STOKE_WITH_CUDNN
namespace {

// cuDNN's status as Status (cuDNN is used in this file only; cuBLAS's mapping is kernels/cuda/cuda_check.h's).
Status CudnnError(cudnnStatus_t st, const char* what) {
  return InternalError("cuDNN {}: {}", what, cudnnGetErrorString(st));
}
#define CUDNN_RETURN_IF_ERROR(expr, what)                        \
  do {                                                           \
    const cudnnStatus_t _s = (expr);                             \
    if (_s != CUDNN_STATUS_SUCCESS) return CudnnError(_s, what); \
  } while (0)

// cuDNN's largest workspace we accept for one conv (an algorithm asking more is passed over).
constexpr size_t kMaxCudnnWorkspace = size_t{1} << 30;

// What cudnnFindConvolutionForwardAlgorithm chose for one conv geometry (cached per runner: ResNet repeats
// its shapes, and each batch size is a new plan).
struct CudnnChoice {
  bool supported = false;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  cudnnMathType_t math = CUDNN_TENSOR_OP_MATH;
  size_t workspace = 0;
  bool fused = false;
};
using CudnnKey = std::array<int64_t, 16>;

}  // namespace

// One conv step's cuDNN setup for one input shape: NHWC tensors, the KRSC filter (our packed weights without
// the im2col path's row padding), cross-correlation with fp32 accumulation on tensor cores, and the algorithm
// found for it.
struct CudnnConvStep {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t workspace = 0;
  // cudnnConvolutionBiasActivationForward (conv + bias, + ReLU when `relu`); else cudnnConvolutionForward and
  // the caller's bias + activation pass. Cleared at run time if cuDNN refuses the fused call (NOT_SUPPORTED or
  // BAD_PARAM for this algorithm / data type).
  mutable bool fused = false;
  bool relu = false;

  CudnnConvStep() = default;
  CudnnConvStep(const CudnnConvStep&) = delete;
  CudnnConvStep& operator=(const CudnnConvStep&) = delete;
  ~CudnnConvStep() {
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
    if (y != nullptr) cudnnDestroyTensorDescriptor(y);
    if (bias != nullptr) cudnnDestroyTensorDescriptor(bias);
    if (w != nullptr) cudnnDestroyFilterDescriptor(w);
    if (conv != nullptr) cudnnDestroyConvolutionDescriptor(conv);
    if (act != nullptr) cudnnDestroyActivationDescriptor(act);
  }

  Status Describe(const cpu::Conv2dShape& c, cudnnDataType_t dt) {
    const int64_t dims[] = {c.batch, c.in_h,  c.in_w,     c.in_c,    c.out_h,
                            c.out_w, c.out_c, c.kernel_h, c.kernel_w};
    for (int64_t d : dims) {
      if (d > INT32_MAX) return InvalidArgumentError("a conv dimension of {} is over cuDNN's 32 bits", d);
    }
    auto i32 = [](int64_t v) { return static_cast<int>(v); };
    CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&x), "create tensor descriptor");
    CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&y), "create tensor descriptor");
    CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&bias), "create tensor descriptor");
    CUDNN_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&w), "create filter descriptor");
    CUDNN_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(&conv), "create convolution descriptor");
    CUDNN_RETURN_IF_ERROR(cudnnCreateActivationDescriptor(&act), "create activation descriptor");
    CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, dt, i32(c.batch), i32(c.in_c),
                                                     i32(c.in_h), i32(c.in_w)),
                          "input descriptor");
    CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NHWC, dt, i32(c.batch), i32(c.out_c),
                                                     i32(c.out_h), i32(c.out_w)),
                          "output descriptor");
    CUDNN_RETURN_IF_ERROR(cudnnSetTensor4dDescriptor(bias, CUDNN_TENSOR_NHWC, dt, 1, i32(c.out_c), 1, 1),
                          "bias descriptor");
    CUDNN_RETURN_IF_ERROR(
        cudnnSetFilter4dDescriptor(w, dt, CUDNN_TENSOR_NHWC, i32(c.out_c), i32(c.in_c / c.groups),
                                   i32(c.kernel_h), i32(c.kernel_w)),
        "filter descriptor");
    // Padding: cuDNN's is symmetric (the plan's top/left here). Where the plan's bottom/right padding differs
    // but the output size comes out the same, both read the same windows (outside the image: zeros); where
    // the size differs, Unimplemented below and the step runs im2col.
    CUDNN_RETURN_IF_ERROR(
        cudnnSetConvolution2dDescriptor(conv, i32(c.pad_top), i32(c.pad_left), i32(c.stride_h),
                                        i32(c.stride_w), i32(c.dilation_h), i32(c.dilation_w),
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        "convolution descriptor");
    CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionGroupCount(conv, i32(c.groups)), "group count");
    CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(conv, CUDNN_TENSOR_OP_MATH), "math type");
    int n = 0, oc = 0, oh = 0, ow = 0;
    CUDNN_RETURN_IF_ERROR(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &n, &oc, &oh, &ow), "output dim");
    if (oh != c.out_h || ow != c.out_w || oc != c.out_c) {
      return UnimplementedError(
          "cuDNN's output {}x{}x{} differs from the plan's {}x{}x{} (asymmetric padding)", oh, ow, oc,
          c.out_h, c.out_w, c.out_c);
    }
    return OkStatus();
  }
};

void CudnnConvStepDeleter::operator()(CudnnConvStep* s) const {
  delete s;
}

struct CudnnConvs::Impl {
  cudnnHandle_t dnn = nullptr;
  std::map<CudnnKey, CudnnChoice> choices;  // per conv geometry (batch included)
  DeviceMemory ws;                          // the workspace, the largest any prepared step asked for
  size_t ws_bytes = 0;

  ~Impl() {
    if (dnn != nullptr) cudnnDestroy(dnn);
  }

  // The fastest algorithm cuDNN measures (cudnnFindConvolutionForwardAlgorithm; its heuristic,
  // cudnnGetConvolutionForwardAlgorithm_v7, when measuring fails). Fused (conv + bias (+ ReLU) in one call)
  // with ReLU or no activation; cuDNN fuses an IDENTITY activation only with IMPLICIT_PRECOMP_GEMM, taken
  // when it measures within 10% of the best (that saves the caller's bias pass).
  StatusOr<CudnnChoice> FindAlgorithm(const CudnnConvStep& cc) {
    constexpr int kCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    cudnnConvolutionFwdAlgoPerf_t perf[kCount] = {};
    int n = 0;
    bool measured = true;
    if (cudnnFindConvolutionForwardAlgorithm(dnn, cc.x, cc.w, cc.conv, cc.y, kCount, &n, perf) !=
        CUDNN_STATUS_SUCCESS) {
      measured = false;
      CUDNN_RETURN_IF_ERROR(
          cudnnGetConvolutionForwardAlgorithm_v7(dnn, cc.x, cc.w, cc.conv, cc.y, kCount, &n, perf),
          "GetConvolutionForwardAlgorithm_v7");
    }
    CudnnChoice ch;
    const cudnnConvolutionFwdAlgoPerf_t* best = nullptr;
    const cudnnConvolutionFwdAlgoPerf_t* precomp = nullptr;
    for (int i = 0; i < n; ++i) {
      const cudnnConvolutionFwdAlgoPerf_t& p = perf[i];
      if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxCudnnWorkspace) continue;
      if (best == nullptr) best = &p;
      if (precomp == nullptr && p.algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) precomp = &p;
    }
    if (best == nullptr) return ch;  // none: im2col for this step
    const cudnnConvolutionFwdAlgoPerf_t* pick = best;
    ch.fused = cc.relu || best->algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    if (!ch.fused && precomp != nullptr && measured && precomp->time <= 1.1f * best->time) {
      pick = precomp;
      ch.fused = true;
    }
    ch.supported = true;
    ch.algo = pick->algo, ch.math = pick->mathType, ch.workspace = pick->memory;
    return ch;
  }
};

CudnnConvs::CudnnConvs(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnConvs::~CudnnConvs() = default;

StatusOr<std::unique_ptr<CudnnConvs>> CudnnConvs::Create(cudaStream_t stream) {
  auto impl = std::make_unique<Impl>();
  CUDNN_RETURN_IF_ERROR(cudnnCreate(&impl->dnn), "create (is libcudnn.so.9 with its engine libraries installed?)");
  CUDNN_RETURN_IF_ERROR(cudnnSetStream(impl->dnn, stream), "set stream");
  return std::unique_ptr<CudnnConvs>(new CudnnConvs(std::move(impl)));
}

StatusOr<CudnnConvStepPtr> CudnnConvs::Prepare(const cpu::Conv2dShape& c, bool relu, ElemType elem) {
  const cudnnDataType_t dt = elem == ElemType::kBF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  CudnnConvStepPtr cc(new CudnnConvStep());
  Status st = cc->Describe(c, dt);
  if (st.code() == StatusCode::kUnimplemented) return CudnnConvStepPtr();
  RETURN_IF_ERROR(st);
  cc->relu = relu;
  CUDNN_RETURN_IF_ERROR(
      cudnnSetActivationDescriptor(cc->act, relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
                                   CUDNN_PROPAGATE_NAN, 0.0),
      "activation descriptor");
  const CudnnKey key = {c.batch,    c.in_h,       c.in_w,       c.in_c,   c.out_c,   c.kernel_h,
                        c.kernel_w, c.stride_h,   c.stride_w,   c.pad_top, c.pad_left, c.dilation_h,
                        c.dilation_w, c.groups, relu ? 1 : 0, static_cast<int64_t>(dt)};
  auto it = impl_->choices.find(key);
  if (it == impl_->choices.end()) {
    ASSIGN_OR_RETURN(CudnnChoice ch, impl_->FindAlgorithm(*cc));
    it = impl_->choices.emplace(key, ch).first;
  }
  const CudnnChoice& ch = it->second;
  if (!ch.supported) return CudnnConvStepPtr();
  cc->algo = ch.algo, cc->workspace = ch.workspace, cc->fused = ch.fused;
  CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(cc->conv, ch.math), "math type");
  if (cc->workspace > impl_->ws_bytes) {
    RETURN_IF_ERROR(impl_->ws.Reserve(cc->workspace));
    impl_->ws_bytes = cc->workspace;
  }
  return cc;
}

StatusOr<CudnnConvDone> CudnnConvs::Run(const CudnnConvStep& cc, const void* x, const void* w,
                                        const void* bias16, void* y) {
  const float one = 1.0f, zero = 0.0f;
  void* ws = cc.workspace > 0 ? impl_->ws.get() : nullptr;
  if (cc.fused) {
    // z = y with alpha2 0: cuDNN wants a z tensor; no residual is added.
    const cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
        impl_->dnn, &one, cc.x, x, cc.w, w, cc.conv, cc.algo, ws, cc.workspace, &zero, cc.y, y, cc.bias, bias16,
        cc.act, cc.y, y);
    if (st == CUDNN_STATUS_SUCCESS) return CudnnConvDone{.bias = true, .relu = cc.relu};
    // Refused (this version's fused call lacks the algorithm or data type): from now on the plain conv and
    // the caller's bias + activation pass, which give the same result.
    if (st != CUDNN_STATUS_NOT_SUPPORTED && st != CUDNN_STATUS_BAD_PARAM) {
      return CudnnError(st, "ConvolutionBiasActivationForward");
    }
    cc.fused = false;
  }
  CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(impl_->dnn, &one, cc.x, x, cc.w, w, cc.conv, cc.algo, ws,
                                                cc.workspace, &zero, cc.y, y),
                        "ConvolutionForward");
  return CudnnConvDone{};
}

#else  // !STOKE_WITH_CUDNN

struct CudnnConvStep {};
void CudnnConvStepDeleter::operator()(CudnnConvStep* s) const {
  delete s;
}
struct CudnnConvs::Impl {};
CudnnConvs::CudnnConvs(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnConvs::~CudnnConvs() = default;

StatusOr<std::unique_ptr<CudnnConvs>> CudnnConvs::Create(cudaStream_t) {
  return FailedPreconditionError(
      "this stoke was built without cuDNN (CMake looks for cudnn.h and libcudnn beside the CUDA toolkit, or in "
      "STOKE_CUDNN_ROOT)");
}
StatusOr<CudnnConvStepPtr> CudnnConvs::Prepare(const cpu::Conv2dShape&, bool, ElemType) {
  return CudnnConvStepPtr();
}
StatusOr<CudnnConvDone> CudnnConvs::Run(const CudnnConvStep&, const void*, const void*, const void*, void*) {
  return UnimplementedError("cuDNN is not in this build");
}

#endif  // STOKE_WITH_CUDNN

}  // namespace stoke::cnn::cuda
