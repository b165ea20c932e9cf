#include "engine/loader/hf_folder.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "base/file_util.h"
#include "base/logging.h"

namespace stoke {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxJsonBytes = size_t{64} << 20;  // index / config files are KBs; refuse absurd ones

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// 1-based line and column of byte `pos` (nlohmann reports the byte after the offending token).
std::pair<size_t, size_t> LineColumn(std::string_view text, size_t pos) {
  pos = std::min(pos, text.size());
  size_t line = 1, col = 1;
  for (size_t i = 0; i + 1 < pos; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

// A shard name from the index must stay inside the folder.
bool SafeRelativeName(const std::string& name) {
  if (name.empty() || name.front() == '/') return false;
  for (const auto& part : fs::path(name)) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

std::string NormalizeHfTensorName(std::string_view name) {
  std::string s(name);
  if (s.rfind("bert.", 0) == 0) s.erase(0, 5);
  if (EndsWith(s, "LayerNorm.gamma")) {
    s.replace(s.size() - 5, 5, "weight");
  } else if (EndsWith(s, "LayerNorm.beta")) {
    s.replace(s.size() - 4, 4, "bias");
  }
  return s;
}

StatusOr<json> ReadJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, kMaxJsonBytes));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;
  std::string why = "syntax error";
  size_t byte = text.size();
  try {
    json again = json::parse(text);
    (void)again;
  } catch (const json::parse_error& e) {
    byte = e.byte;
    // nlohmann's message is "[json.exception.parse_error.101] parse error at line L, column C: <what>"; keep
    // <what>.
    why = e.what();
    const size_t colon = why.find(": ");
    if (colon != std::string::npos) why = why.substr(colon + 2);
  } catch (const std::exception& e) {
    why = e.what();
  }
  const auto [line, col] = LineColumn(text, byte);
  return InvalidArgumentError("{}:{}:{}: invalid JSON: {}", path, line, col, why);
}

StatusOr<std::unique_ptr<HfFolder>> HfFolder::Open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    if (!fs::exists(dir, ec)) return NotFoundError("{}: no such model folder", dir);
    return InvalidArgumentError("{}: not a folder (an HF model is a folder with config.json)", dir);
  }
  std::unique_ptr<HfFolder> f(new HfFolder());
  f->dir_ = dir;
  while (f->dir_.size() > 1 && f->dir_.back() == '/') f->dir_.pop_back();
  const std::string config_path = f->FilePath("config.json");
  if (!fs::exists(config_path, ec))
    return NotFoundError("{}: no config.json (not a Hugging Face model folder)", dir);
  ASSIGN_OR_RETURN(f->config_, ReadJsonFile(config_path));
  if (!f->config_.is_object()) return InvalidArgumentError("{}: top level is not a JSON object", config_path);
  RETURN_IF_ERROR(f->LoadWeights());
  return f;
}

Status HfFolder::LoadWeights() {
  const std::string index_path = FilePath("model.safetensors.index.json");
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    ASSIGN_OR_RETURN(json index, ReadJsonFile(index_path));
    const auto wm = index.is_object() ? index.find("weight_map") : index.end();
    if (wm == index.end() || !wm->is_object()) {
      return InvalidArgumentError("{}: no \"weight_map\" object", index_path);
    }
    // shard file -> tensors the index says it holds. std::map: shards are opened in name order, each once.
    std::map<std::string, std::vector<std::string>> by_shard;
    for (const auto& [tensor, shard] : wm->items()) {
      if (!shard.is_string() || !SafeRelativeName(shard.get<std::string>())) {
        return InvalidArgumentError("{}: weight_map entry for '{}' is not a file name inside the folder",
                                    index_path, tensor);
      }
      by_shard[shard.get<std::string>()].push_back(tensor);
    }
    if (by_shard.empty()) return InvalidArgumentError("{}: weight_map is empty", index_path);
    for (const auto& [shard, names] : by_shard) {
      ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(FilePath(shard)));
      RETURN_IF_ERROR(AddShard(std::move(file), &names));
    }
    return OkStatus();
  }
  const std::string single = FilePath("model.safetensors");
  if (fs::exists(single, ec)) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single));
    return AddShard(std::move(file), nullptr);
  }
  if (fs::exists(FilePath("pytorch_model.bin"), ec)) {
    return UnimplementedError("{}: only pytorch_model.bin (pickle) weights; stoke reads safetensors only",
                              dir_);
  }
  return NotFoundError("{}: no model.safetensors or model.safetensors.index.json", dir_);
}

Status HfFolder::AddShard(std::unique_ptr<SafetensorsFile> shard, const std::vector<std::string>* expected) {
  if (expected != nullptr) {
    for (const std::string& name : *expected) {
      if (shard->FindTensor(name) == nullptr) {
        return DataLossError(
            "{}: tensor '{}' is listed for this shard in model.safetensors.index.json but is not in it",
            shard->path(), name);
      }
    }
  }
  for (const TensorRef& t : shard->tensors()) {
    TensorRef ref = t;
    ref.name = NormalizeHfTensorName(t.name);
    const size_t pos = tensors_.size();
    for (const std::string* key : std::initializer_list<const std::string*>{&ref.name, &t.name}) {
      auto [it, inserted] = index_.emplace(*key, pos);
      if (!inserted && it->second != pos) {
        return InvalidArgumentError("{}: tensor '{}' (as '{}') is defined twice in {}", shard->path(), t.name,
                                    *key, dir_);
      }
    }
    tensors_.push_back(std::move(ref));
  }
  shards_.push_back(std::move(shard));
  return OkStatus();
}

const TensorRef* HfFolder::FindTensor(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::string HfFolder::FilePath(std::string_view name) const {
  return dir_ + "/" + std::string(name);
}

bool HfFolder::HasFile(std::string_view name) const {
  std::error_code ec;
  return fs::exists(FilePath(name), ec);
}

std::optional<int> HfFolder::SentenceMaxSeqLength() const {
  const std::string path = FilePath("sentence_bert_config.json");
  if (!HasFile("sentence_bert_config.json")) return std::nullopt;
  auto j = ReadJsonFile(path);
  if (!j.ok()) {
    LOG_WARN("ignoring {}", j.status().message());
    return std::nullopt;
  }
  const auto it = j->is_object() ? j->find("max_seq_length") : j->end();
  if (it == j->end() || !it->is_number_integer() || it->get<int64_t>() <= 0 ||
      it->get<int64_t>() > (1 << 30)) {
    return std::nullopt;
  }
  return static_cast<int>(it->get<int64_t>());
}

}  // namespace stoke
