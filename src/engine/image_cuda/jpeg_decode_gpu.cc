#include "engine/image_cuda/jpeg_decode_gpu.h"

#include <fmt/format.h>
#include <nvjpeg.h>

#include <algorithm>

#include "engine/image/image_decode.h"
#include "kernels/cuda/cuda_check.h"

namespace stoke::image::cuda {
namespace {

const char* NvjpegStatusName(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS:
      return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED:
      return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER:
      return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG:
      return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH:
      return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR:
      return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      return "incomplete bitstream";
  }
  return "unknown status";
}

#define NVJPEG_RETURN_IF_ERROR(expr)                                                                     \
  do {                                                                                                   \
    const nvjpegStatus_t _s = (expr);                                                                    \
    if (_s != NVJPEG_STATUS_SUCCESS) return InternalError("nvJPEG {}: {}", #expr, NvjpegStatusName(_s)); \
  } while (0)

bool IsJpeg(std::string_view b) {
  return b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xFF && static_cast<uint8_t>(b[1]) == 0xD8 &&
         static_cast<uint8_t>(b[2]) == 0xFF;
}

const unsigned char* Bytes(std::string_view b) {
  return reinterpret_cast<const unsigned char*>(b.data());
}

// libjpeg-turbo interpolates subsampled chroma ("fancy upsampling"); nvJPEG replicates it unless asked. A
// backend that refuses the flag is created without it.
nvjpegStatus_t CreateHandle(nvjpegBackend_t backend, nvjpegHandle_t* h) {
  const nvjpegStatus_t s =
      nvjpegCreateEx(backend, nullptr, nullptr, NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION, h);
  if (s == NVJPEG_STATUS_SUCCESS) return s;
  return nvjpegCreateEx(backend, nullptr, nullptr, 0, h);
}

enum class Route { kBatched, kSingle, kCpu };

class NvjpegDecoder final : public GpuJpegDecoder {
 public:
  explicit NvjpegDecoder(cudaStream_t stream) : stream_(stream) {}
  ~NvjpegDecoder() override {
    if (stream_parse_ != nullptr) nvjpegJpegStreamDestroy(stream_parse_);
    if (hw_state_ != nullptr) nvjpegJpegStateDestroy(hw_state_);
    if (hw_ != nullptr) nvjpegDestroy(hw_);
    if (batch_state_ != nullptr) nvjpegJpegStateDestroy(batch_state_);
    if (single_state_ != nullptr) nvjpegJpegStateDestroy(single_state_);
    if (hybrid_ != nullptr) nvjpegDestroy(hybrid_);
    if (buf_ != nullptr) cudaFree(buf_);
  }

  Status Init(bool hardware) {
    NVJPEG_RETURN_IF_ERROR(CreateHandle(NVJPEG_BACKEND_HYBRID, &hybrid_));
    NVJPEG_RETURN_IF_ERROR(nvjpegJpegStateCreate(hybrid_, &single_state_));
    NVJPEG_RETURN_IF_ERROR(nvjpegJpegStateCreate(hybrid_, &batch_state_));
    // A GPU without the hardware decoder refuses the backend: the hybrid one batches then.
    if (hardware && CreateHandle(NVJPEG_BACKEND_HARDWARE, &hw_) == NVJPEG_STATUS_SUCCESS) {
      NVJPEG_RETURN_IF_ERROR(nvjpegJpegStateCreate(hw_, &hw_state_));
      NVJPEG_RETURN_IF_ERROR(nvjpegJpegStreamCreate(hw_, &stream_parse_));
    } else {
      hw_ = nullptr;
    }
    return OkStatus();
  }

  const char* backend() const override { return hw_ != nullptr ? "hardware" : "hybrid"; }

  Status Decode(std::span<const std::string_view> images, std::vector<DeviceRgb>* out,
                GpuJpegStats* stats) override {
    const size_t n = images.size();
    route_.assign(n, Route::kCpu);
    out->assign(n, DeviceRgb{});
    cpu_.resize(n);
    GpuJpegStats st;
    // 1. Sizes from the headers; what nvJPEG cannot take is decoded on the CPU now.
    size_t bytes = 0;
    std::vector<size_t> offset(n);
    for (size_t i = 0; i < n; ++i) {
      int64_t w = 0, h = 0;
      if (Probe(images[i], &w, &h)) {
        route_[i] = Route::kBatched;
      } else {
        RETURN_IF_ERROR(CpuDecode(images[i], i));
        w = cpu_[i].width, h = cpu_[i].height;
      }
      (*out)[i].width = w, (*out)[i].height = h;
      offset[i] = bytes;
      bytes += static_cast<size_t>(w * h * 3);
    }
    RETURN_IF_ERROR(Reserve(bytes));
    for (size_t i = 0; i < n; ++i) (*out)[i].pixels = buf_ + offset[i];
    // 2. The hardware decoder takes baseline JPEGs only: the rest go to step 4.
    if (hw_ != nullptr) {
      for (size_t i = 0; i < n; ++i) {
        if (route_[i] != Route::kBatched) continue;
        int unsupported = 1;
        if (nvjpegJpegStreamParseHeader(hw_, Bytes(images[i]), images[i].size(), stream_parse_) !=
                NVJPEG_STATUS_SUCCESS ||
            nvjpegDecodeBatchedSupported(hw_, stream_parse_, &unsupported) != NVJPEG_STATUS_SUCCESS ||
            unsupported != 0) {
          route_[i] = Route::kSingle;
        }
      }
    }
    // 3. One batched call; if it fails, each of its images is retried alone.
    data_.clear(), lengths_.clear(), dest_.clear();
    std::vector<size_t> batch;
    for (size_t i = 0; i < n; ++i) {
      if (route_[i] != Route::kBatched) continue;
      batch.push_back(i);
      data_.push_back(Bytes(images[i]));
      lengths_.push_back(images[i].size());
      dest_.push_back(Dest((*out)[i]));
    }
    if (!batch.empty()) {
      nvjpegHandle_t h = hw_ != nullptr ? hw_ : hybrid_;
      nvjpegJpegState_t s = hw_ != nullptr ? hw_state_ : batch_state_;
      // Initialised once per batch size, and again after a failed batch (nvJPEG's reset).
      const int size = static_cast<int>(batch.size());
      bool ok = size == batched_size_ ||
                nvjpegDecodeBatchedInitialize(h, s, size, 1, NVJPEG_OUTPUT_RGBI) == NVJPEG_STATUS_SUCCESS;
      ok = ok && nvjpegDecodeBatched(h, s, data_.data(), lengths_.data(), dest_.data(), stream_) ==
                     NVJPEG_STATUS_SUCCESS;
      batched_size_ = ok ? size : 0;
      if (ok) {
        st.batched = size;
      } else {
        for (size_t i : batch) route_[i] = Route::kSingle;
      }
    }
    // 4. One by one. With the hardware decoder, what it refused (progressive JPEGs) goes to the CPU: the hybrid
    //    backend's pixels differ from libjpeg-turbo's by up to 3 grey levels (measured on the H200: its IDCT is
    //    not libjpeg's islow), the hardware's by none. Without it, the hybrid backend decodes it alone. What
    //    nvJPEG refuses here goes to the CPU, whose error names the problem.
    for (size_t i = 0; i < n; ++i) {
      if (route_[i] != Route::kSingle) continue;
      nvjpegImage_t d = Dest((*out)[i]);
      if (hw_ == nullptr &&
          nvjpegDecode(hybrid_, single_state_, Bytes(images[i]), images[i].size(), NVJPEG_OUTPUT_RGBI, &d,
                       stream_) == NVJPEG_STATUS_SUCCESS) {
        ++st.single;
        continue;
      }
      RETURN_IF_ERROR(CpuDecode(images[i], i));
      if (cpu_[i].width != (*out)[i].width || cpu_[i].height != (*out)[i].height) {
        return InvalidArgumentError("image {}: its JPEG header says {}x{} but it decodes to {}x{}", i,
                                    (*out)[i].width, (*out)[i].height, cpu_[i].width, cpu_[i].height);
      }
      route_[i] = Route::kCpu;
    }
    // 5. The CPU-decoded pixels up (pageable copies: the call returns once the source is read).
    for (size_t i = 0; i < n; ++i) {
      if (route_[i] != Route::kCpu) continue;
      ++st.cpu;
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buf_ + offset[i], cpu_[i].pixels.data(), cpu_[i].pixels.size(),
                                           cudaMemcpyHostToDevice, stream_));
    }
    if (stats != nullptr) *stats = st;
    return OkStatus();
  }

 private:
  // A JPEG nvJPEG can take (1 or 3 components, a known subsampling, a sane size): its size.
  bool Probe(std::string_view b, int64_t* w, int64_t* h) const {
    if (!IsJpeg(b)) return false;
    int comps = 0;
    nvjpegChromaSubsampling_t css{};
    int widths[NVJPEG_MAX_COMPONENT] = {}, heights[NVJPEG_MAX_COMPONENT] = {};
    if (nvjpegGetImageInfo(hybrid_, Bytes(b), b.size(), &comps, &css, widths, heights) !=
        NVJPEG_STATUS_SUCCESS) {
      return false;
    }
    if ((comps != 1 && comps != 3) || css == NVJPEG_CSS_UNKNOWN) return false;
    *w = widths[0], *h = heights[0];
    return *w >= 1 && *h >= 1 && *w * *h <= kMaxPixels;
  }

  Status CpuDecode(std::string_view b, size_t i) {
    return DecodeImage(b, &cpu_[i]).WithContext(fmt::format("image {}", i));
  }

  nvjpegImage_t Dest(const DeviceRgb& im) const {
    nvjpegImage_t d{};
    d.channel[0] = const_cast<unsigned char*>(im.pixels);
    d.pitch[0] = static_cast<size_t>(im.width * 3);
    return d;
  }

  Status Reserve(size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);
    if (bytes <= cap_) return OkStatus();
    if (buf_ != nullptr) cudaFree(buf_);
    buf_ = nullptr, cap_ = 0;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&buf_, bytes));
    cap_ = bytes;
    return OkStatus();
  }

  cudaStream_t stream_;
  nvjpegHandle_t hybrid_ = nullptr;  // single decodes; batched ones without hardware
  nvjpegJpegState_t single_state_ = nullptr, batch_state_ = nullptr;
  nvjpegHandle_t hw_ = nullptr;  // the hardware decoder, when the GPU has one
  nvjpegJpegState_t hw_state_ = nullptr;
  nvjpegJpegStream_t stream_parse_ = nullptr;
  int batched_size_ = 0;    // the batch size the batched state is initialised for (0: none)
  uint8_t* buf_ = nullptr;  // every image of the batch, RGB8, one after another
  size_t cap_ = 0;
  std::vector<Route> route_;
  std::vector<RgbImage> cpu_;
  std::vector<const unsigned char*> data_;
  std::vector<size_t> lengths_;
  std::vector<nvjpegImage_t> dest_;
};

}  // namespace

bool NvjpegInBuild() {
  return true;
}

StatusOr<std::unique_ptr<GpuJpegDecoder>> GpuJpegDecoder::Create(const GpuJpegDecoderOptions& options) {
  auto d = std::make_unique<NvjpegDecoder>(options.stream);
  RETURN_IF_ERROR(d->Init(options.hardware));
  return std::unique_ptr<GpuJpegDecoder>(std::move(d));
}

}  // namespace stoke::image::cuda
