#include "server/repository_folder.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string_view>

#include "base/file_util.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;

StatusOr<toml::table> ParseToml(const fs::path& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path.string()));
  try {
    return toml::parse(text, path.string());
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    return InvalidArgumentError("{}: TOML: {} (at {})", path.string(), std::string(e.description()),
                                where.str());
  }
}

// The folder's one file with `extension` ("" when none); two or more are an error.
StatusOr<std::string> OnlyFile(const fs::path& dir, std::string_view extension) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    if (f.path().extension() == extension) found.push_back(f.path());
  }
  if (found.size() > 1) {
    return InvalidArgumentError("{}: {} *{} files; name one with `source` in stoke.toml", dir.string(),
                                found.size(), extension);
  }
  return found.empty() ? std::string() : found[0].string();
}

// The model in a folder without `source`: its *.gguf file, model.json, its *.onnx file (an image classifier
// with the ImageNet defaults), or the folder itself (HF files).
StatusOr<std::string> FolderSource(const fs::path& dir) {
  ASSIGN_OR_RETURN(std::string gguf, OnlyFile(dir, ".gguf"));
  if (!gguf.empty()) return gguf;
  std::error_code ec;
  if (fs::exists(dir / "model.json", ec)) return (dir / "model.json").string();
  ASSIGN_OR_RETURN(std::string onnx, OnlyFile(dir, ".onnx"));
  if (!onnx.empty()) return onnx;
  if (fs::exists(dir / "config.json", ec)) return dir.string();
  return InvalidArgumentError(
      "{}: no model here (a *.gguf file, model.json, a *.onnx file, or an HF folder's config.json), and no "
      "`source` in stoke.toml",
      dir.string());
}

Status ApplyToml(const fs::path& file, const fs::path& dir, ModelSettings* m) {
  ASSIGN_OR_RETURN(toml::table t, ParseToml(file));
  const std::string where = file.string();
  for (const auto& [k, node] : t) {
    std::string key(k.str());
    std::replace(key.begin(), key.end(), '-', '_');
    // The string value, or "" with *error set.
    auto str = [&](Status* error) -> std::string {
      if (!node.is_string()) {
        *error = InvalidArgumentError("{}: '{}' must be a string", where, key);
        return "";
      }
      return *node.value<std::string>();
    };
    Status error;
    auto integer = [&]() -> StatusOr<int64_t> {
      if (!node.is_integer()) return InvalidArgumentError("{}: '{}' must be an integer", where, key);
      return *node.value<int64_t>();
    };
    if (key == "name") {
      m->name = str(&error);
      RETURN_IF_ERROR(error);
    } else if (key == "source" || key == "model") {
      const std::string s = str(&error);
      RETURN_IF_ERROR(error);
      std::error_code ec;
      m->source = fs::path(s).is_relative() && fs::exists(dir / s, ec) ? (dir / s).string() : s;
    } else if (key == "kind") {
      m->kind = str(&error);
      RETURN_IF_ERROR(error);
    } else if (key == "device") {
      const std::string s = str(&error);
      RETURN_IF_ERROR(error);
      if (s != "auto" && s != "cpu" && s != "cuda")
        return InvalidArgumentError("{}: device '{}' must be auto, cpu or cuda", where, s);
      m->device = s;
    } else if (key == "gpu_memory_fraction") {
      if (!node.is_number()) return InvalidArgumentError("{}: '{}' must be a number", where, key);
      const double f = *node.value<double>();
      if (!(f > 0 && f <= 1))
        return InvalidArgumentError("{}: gpu_memory_fraction {} must be in (0, 1]", where, f);
      m->gpu_memory_fraction = f;
    } else if (key == "kv_cache_bytes") {
      ASSIGN_OR_RETURN(int64_t v, integer());
      if (v <= 0) return InvalidArgumentError("{}: kv_cache_bytes must be positive", where);
      m->kv_cache_bytes = v;
    } else if (key == "kv_cache_dtype") {
      const std::string s = str(&error);
      RETURN_IF_ERROR(error);
      auto dtype = ParseKvCacheDtype(s);
      if (!dtype.ok())
        return InvalidArgumentError("{}: kv_cache_dtype '{}' must be auto, bf16, int8 or fp8", where, s);
      m->kv_cache_dtype = *dtype;
    } else if (key == "quantization") {
      const std::string s = str(&error);
      RETURN_IF_ERROR(error);
      auto q = ParseWeightQuantization(s);
      if (!q.ok()) return InvalidArgumentError("{}: quantization '{}' must be none, fp8 or int8", where, s);
      m->quantization = *q;
    } else if (key == "calibration_data") {
      const std::string s = str(&error);
      RETURN_IF_ERROR(error);
      m->calibration_data = fs::path(s).is_relative() ? (dir / s).string() : s;
    } else if (key == "instances") {
      ASSIGN_OR_RETURN(int64_t v, integer());
      if (v < 1 || v > 256) return InvalidArgumentError("{}: instances {} must be in [1, 256]", where, v);
      m->instances = static_cast<int>(v);
    } else if (key == "max_batch_size") {
      ASSIGN_OR_RETURN(int64_t v, integer());
      if (v < 0 || v > 4096)
        return InvalidArgumentError("{}: max_batch_size {} must be in [0, 4096]", where, v);
      m->max_batch_size = static_cast<int>(v);
    } else if (key == "max_queue_delay_us") {
      ASSIGN_OR_RETURN(int64_t v, integer());
      if (v < 0 || v > 60'000'000)
        return InvalidArgumentError("{}: max_queue_delay_us {} must be in [0, 60000000]", where, v);
      m->max_queue_delay_us = v;
    } else if (key == "load") {
      if (!node.is_boolean()) return InvalidArgumentError("{}: 'load' must be true or false", where);
      m->load = *node.value<bool>();
    } else {
      return InvalidArgumentError(
          "{}: unknown key '{}' (name, source, kind, device, gpu_memory_fraction, kv_cache_bytes, "
          "kv_cache_dtype, quantization, calibration_data, instances, max_batch_size, max_queue_delay_us, "
          "load)",
          where, std::string(k.str()));
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<ModelSettings>> ReadRepositoryFolder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return InvalidArgumentError("--model-repository {}: not a folder", dir);
  std::vector<fs::path> folders;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    if (f.is_directory() && !f.path().filename().string().starts_with(".")) folders.push_back(f.path());
  }
  std::sort(folders.begin(), folders.end());
  std::vector<ModelSettings> out;
  for (const fs::path& folder : folders) {
    ModelSettings m;
    m.name = folder.filename().string();
    const fs::path toml = folder / "stoke.toml";
    m.origin = fs::exists(toml, ec) ? toml.string() : folder.string();
    if (fs::exists(toml, ec)) {
      RETURN_IF_ERROR(ApplyToml(toml, folder, &m));
    }
    if (m.source.empty()) {
      ASSIGN_OR_RETURN(m.source, FolderSource(folder));
    }
    out.push_back(std::move(m));
  }
  if (out.empty()) return InvalidArgumentError("--model-repository {}: no model folders in it", dir);
  return out;
}

}  // namespace stoke
