#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/file_util.h"
#include "base/logging.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_check.h"

namespace stoke::cuda {

Status CublasError(const char* file, int line, const char* expr, cublasStatus_t status) {
  return InternalError("{}:{}: {} failed: {} ({})", file, line, expr, cublasLtGetStatusString(status),
                       static_cast<int>(status));
}

// The descriptors of one call, destroyed with it (creating them costs ~1 µs each; cache later if it shows).
struct BlasLtGemm::Descs {
  // alpha = 1, beta = 0 in the descriptor's scale type: fp32, or int32 for the int8 GEMM (CUDA_R_32I).
  bool int32_scale = false;
  const float f_alpha = 1.f, f_beta = 0.f;
  const int32_t i_alpha = 1, i_beta = 0;
  const void* alpha() const { return int32_scale ? static_cast<const void*>(&i_alpha) : &f_alpha; }
  const void* beta() const { return int32_scale ? static_cast<const void*>(&i_beta) : &f_beta; }
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

std::string GemmCacheKey(std::string_view gpu_name, int cc_major, int cc_minor, int cudart_version,
                         size_t cublaslt_version) {
  return fmt::format("{}|sm_{}{}|cudart={}|cublasLt={}", gpu_name, cc_major, cc_minor, cudart_version,
                     cublaslt_version);
}

std::string GemmShapeKey(int64_t m, int64_t n, int64_t k, DType out) {
  return fmt::format("m={},n={},k={},out={}", m, n, k, GetDTypeInfo(out).name);
}

std::string SerializeGemmCache(std::string_view key, const GemmCacheMap& entries) {
  nlohmann::json j;
  j["format"] = "stoke-gemm-cache-v1";
  j["key"] = std::string(key);
  nlohmann::json shapes = nlohmann::json::object();
  for (const auto& [shape, e] : entries) {
    nlohmann::json words = nlohmann::json::array();
    for (uint64_t w : e.algo) words.push_back(fmt::format("{:016x}", w));
    shapes[shape] = {{"algo", words}, {"us", e.micros}};
  }
  j["shapes"] = shapes;
  return j.dump(1);
}

StatusOr<GemmCacheMap> ParseGemmCache(std::string_view text, std::string_view expected_key) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "stoke-gemm-cache-v1" ||
      !j.contains("key") || !j["key"].is_string() || !j.contains("shapes") || !j["shapes"].is_object()) {
    return InvalidArgumentError("not a stoke GEMM cache (format stoke-gemm-cache-v1)");
  }
  const std::string key = j["key"].get<std::string>();
  if (key != expected_key) {
    return FailedPreconditionError("GEMM cache was written for '{}', this machine is '{}'", key,
                                   expected_key);
  }
  GemmCacheMap out;
  for (const auto& [shape, e] : j["shapes"].items()) {
    if (!e.is_object() || !e.contains("algo") || !e["algo"].is_array() || e["algo"].size() != 8) {
      return InvalidArgumentError("GEMM cache entry '{}' malformed", shape);
    }
    GemmCacheEntry entry;
    for (size_t i = 0; i < 8; ++i) {
      if (!e["algo"][i].is_string()) return InvalidArgumentError("GEMM cache entry '{}' malformed", shape);
      const std::string w = e["algo"][i].get<std::string>();
      char* end = nullptr;
      entry.algo[i] = std::strtoull(w.c_str(), &end, 16);
      if (w.empty() || *end != '\0') return InvalidArgumentError("GEMM cache entry '{}' malformed", shape);
    }
    if (e.contains("us") && e["us"].is_number()) entry.micros = e["us"].get<float>();
    out[shape] = entry;
  }
  return out;
}

StatusOr<std::unique_ptr<BlasLtGemm>> BlasLtGemm::Create(const GemmOptions& options) {
  std::unique_ptr<BlasLtGemm> g(new BlasLtGemm());
  g->options_ = options;
  g->options_.candidates = std::max(1, options.candidates);
  g->options_.timing_iters = std::max(1, options.timing_iters);
  int dev = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, dev));
  int rt = 0;
  CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&rt));
  g->key_ = GemmCacheKey(prop.name, prop.major, prop.minor, rt, cublasLtGetVersion());
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&g->handle_));
  if (options.workspace_bytes > 0) CUDA_RETURN_IF_ERROR(cudaMalloc(&g->workspace_, options.workspace_bytes));
  if (!options.cache_path.empty() && std::filesystem::exists(options.cache_path)) {
    auto text = ReadFileToString(options.cache_path);
    if (!text.ok()) {
      g->load_status_ = "unreadable: " + text.status().ToString();
    } else {
      auto parsed = ParseGemmCache(*text, g->key_);
      if (parsed.ok()) {
        g->entries_ = std::move(*parsed);
        g->load_status_ = fmt::format("loaded {}", g->entries_.size());
      } else {
        g->load_status_ = "refused: " + parsed.status().message();
      }
    }
    if (g->entries_.empty())
      LOG_WARN("GEMM cache {}: {}; it will be rebuilt", options.cache_path, g->load_status_);
  }
  return g;
}

BlasLtGemm::~BlasLtGemm() {
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Status BlasLtGemm::Save() const {
  if (options_.cache_path.empty()) return OkStatus();
  const std::string tmp = options_.cache_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return InternalError("cannot write GEMM cache {}", tmp);
    f << SerializeGemmCache(key_, entries_);
    if (!f) return InternalError("cannot write GEMM cache {}", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, options_.cache_path, ec);
  if (ec) return InternalError("cannot rename {} to {}: {}", tmp, options_.cache_path, ec.message());
  return OkStatus();
}

// Column-major view of the row-major product: Y^T[n, m] = W[n, k] · X^T[k, m]. W's memory is a column-major
// k x n matrix (op T), X's a column-major k x m (op N), Y's a column-major n x m with ld n.
// Inputs (`in`): kBF16; kF8E4M3, with outer-vector scales (w_scale per row of W = per column of Y^T's rows,
// x_scale per token); kI8, computed and written in int32 (out_type kI32, int32 alpha / beta: Descs).
static Status BuildDescs(int64_t m, int64_t n, int64_t k, DType out_type, size_t workspace,
                         cublasLtMatmulDesc_t* op, cublasLtMatrixLayout_t* a, cublasLtMatrixLayout_t* b,
                         cublasLtMatrixLayout_t* c, cublasLtMatmulPreference_t* pref, DType in = DType::kBF16,
                         const float* w_scale = nullptr, const float* x_scale = nullptr,
                         GemmEpilogue epilogue = GemmEpilogue::kNone, const void* bias = nullptr) {
  const bool fp8 = in == DType::kF8E4M3, int8 = in == DType::kI8;
  if (int8 ? out_type != DType::kI32 : out_type != DType::kBF16 && out_type != DType::kF32) {
    return InvalidArgumentError("BlasLtGemm: output must be {}, not {}", int8 ? "I32" : "BF16 or F32",
                                GetDTypeInfo(out_type).name);
  }
  const cudaDataType_t ct = int8 ? CUDA_R_32I : out_type == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  if (int8) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(op, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  } else {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  }
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cudaDataType_t it = fp8 ? CUDA_R_8F_E4M3 : int8 ? CUDA_R_8I : CUDA_R_16BF;
  if (fp8) {
    const cublasLtMatmulMatrixScale_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
    CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)));
    CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)));
  }
  if (epilogue != GemmEpilogue::kNone) {
    if (bias == nullptr) return InvalidArgumentError("BlasLtGemm: a bias epilogue needs the bias");
    // Y^T is n x m column-major: cuBLASLt adds the bias per row of Y^T = per output column of y.
    const cublasLtEpilogue_t ep =
        epilogue == GemmEpilogue::kBias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    const cudaDataType_t bt = CUDA_R_16BF;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(a, it, k, n, k));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(b, it, k, m, k));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(c, ct, n, m, n));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(pref));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &workspace, sizeof(workspace)));
  return OkStatus();
}

Status BlasLtGemm::Choose(const Descs& d, const std::string& shape, const void* x, const void* w, void* y,
                          cudaStream_t stream, cublasLtMatmulAlgo_t* algo) {
  auto it = entries_.find(shape);
  if (it != entries_.end()) {
    static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(it->second.algo));
    std::memcpy(algo, it->second.algo.data(), sizeof(*algo));
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(handle_, d.op, d.a, d.b, d.c, d.c, algo, &check) == CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= options_.workspace_bytes) {
      return OkStatus();
    }
    LOG_WARN("GEMM cache: stored algorithm for {} rejected by cuBLASLt; re-tuning", shape);
    entries_.erase(it);
  }
  std::vector<cublasLtMatmulHeuristicResult_t> cands(options_.candidates);
  int returned = 0;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, d.pref,
                                                    options_.candidates, cands.data(), &returned));
  if (returned <= 0) return UnimplementedError("cuBLASLt has no algorithm for {}", shape);
  const void* alpha = d.alpha();
  const void* beta = d.beta();
  int best = 0;
  float best_us = 0.f;
  if (returned > 1) {
    cudaEvent_t e0, e1;
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&e1));
    best = -1;
    for (int i = 0; i < returned; ++i) {
      const auto* al = &cands[i].algo;
      if (cublasLtMatmul(handle_, d.op, alpha, w, d.a, x, d.b, beta, y, d.c, y, d.c, al, workspace_,
                         options_.workspace_bytes, stream) != CUBLAS_STATUS_SUCCESS) {
        continue;  // a candidate that cannot run here is skipped, not fatal
      }
      cudaEventRecord(e0, stream);
      for (int r = 0; r < options_.timing_iters; ++r) {
        cublasLtMatmul(handle_, d.op, alpha, w, d.a, x, d.b, beta, y, d.c, y, d.c, al, workspace_,
                       options_.workspace_bytes, stream);
      }
      cudaEventRecord(e1, stream);
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e1));
      float ms = 0.f;
      cudaEventElapsedTime(&ms, e0, e1);
      const float us = ms * 1000.f / options_.timing_iters;
      if (best < 0 || us < best_us) best = i, best_us = us;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (best < 0) return InternalError("no cuBLASLt candidate ran for {}", shape);
  }
  *algo = cands[best].algo;
  GemmCacheEntry e;
  std::memcpy(e.algo.data(), algo, sizeof(*algo));
  e.micros = best_us;
  entries_[shape] = e;
  LOG_DEBUG("GEMM {}: candidate {} of {} ({:.1f} us)", shape, best, returned, best_us);
  return OkStatus();
}

Status BlasLtGemm::Tune(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, DType out_type, int64_t m,
                        int64_t n, int64_t k, cudaStream_t stream) {
  Descs d;
  RETURN_IF_ERROR(BuildDescs(m, n, k, out_type, options_.workspace_bytes, &d.op, &d.a, &d.b, &d.c, &d.pref));
  cublasLtMatmulAlgo_t algo;
  return Choose(d, GemmShapeKey(m, n, k, out_type), x, w, y, stream, &algo);
}

Status BlasLtGemm::Run(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, DType out_type, int64_t m,
                       int64_t n, int64_t k, cudaStream_t stream, GemmEpilogue epilogue,
                       const __nv_bfloat16* bias) {
  if (m <= 0 || n <= 0) return OkStatus();
  Descs d;
  RETURN_IF_ERROR(BuildDescs(m, n, k, out_type, options_.workspace_bytes, &d.op, &d.a, &d.b, &d.c, &d.pref,
                             DType::kBF16, nullptr, nullptr, epilogue, bias));
  std::string shape = GemmShapeKey(m, n, k, out_type);
  if (epilogue == GemmEpilogue::kBias) shape += ",ep=bias";
  if (epilogue == GemmEpilogue::kGeluBias) shape += ",ep=gelu_bias";
  cublasLtMatmulAlgo_t algo;
  RETURN_IF_ERROR(Choose(d, shape, x, w, y, stream, &algo));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, d.op, d.alpha(), w, d.a, x, d.b, d.beta(), y, d.c, y, d.c, &algo,
                                    workspace_, options_.workspace_bytes, stream));
  return OkStatus();
}

Status BlasLtGemm::RunFp8(const uint8_t* x, const float* x_scale, const uint8_t* w, const float* w_scale, void* y,
                          DType out_type, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return OkStatus();
  if (k % 16 != 0) return InvalidArgumentError("BlasLtGemm::RunFp8: k {} must be a multiple of 16", k);
  Descs d;
  RETURN_IF_ERROR(BuildDescs(m, n, k, out_type, options_.workspace_bytes, &d.op, &d.a, &d.b, &d.c, &d.pref,
                             DType::kF8E4M3, w_scale, x_scale));
  cublasLtMatmulAlgo_t algo;
  RETURN_IF_ERROR(Choose(d, GemmShapeKey(m, n, k, out_type) + ",in=F8_E4M3", x, w, y, stream, &algo));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, d.op, d.alpha(), w, d.a, x, d.b, d.beta(), y, d.c, y, d.c, &algo,
                                    workspace_, options_.workspace_bytes, stream));
  return OkStatus();
}

Status BlasLtGemm::RunInt8(const int8_t* x, const int8_t* w, int32_t* acc, int64_t m, int64_t n, int64_t k,
                           cudaStream_t stream) {
  if (m <= 0 || n <= 0) return OkStatus();
  if (k % 4 != 0 || n % 4 != 0) {
    return InvalidArgumentError("BlasLtGemm::RunInt8: k {} and n {} must be multiples of 4", k, n);
  }
  Descs d;
  d.int32_scale = true;
  RETURN_IF_ERROR(BuildDescs(m, n, k, DType::kI32, options_.workspace_bytes, &d.op, &d.a, &d.b, &d.c, &d.pref,
                             DType::kI8));
  cublasLtMatmulAlgo_t algo;
  RETURN_IF_ERROR(Choose(d, GemmShapeKey(m, n, k, DType::kI32) + ",in=I8", x, w, acc, stream, &algo));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle_, d.op, d.alpha(), w, d.a, x, d.b, d.beta(), acc, d.c, acc, d.c,
                                        &algo, workspace_, options_.workspace_bytes, stream));
  return OkStatus();
}

}  // namespace stoke::cuda
