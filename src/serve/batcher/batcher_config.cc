#include "serve/batcher/batcher_config.h"

#include <algorithm>
#include <charconv>

namespace stoke {
namespace {

using nlohmann::json;

// A non-negative integer given as a JSON number or a numeric string (Triton writes uint64 as strings).
StatusOr<int64_t> GetUint(const json& j, std::string_view key, std::string_view where) {
  if (j.is_number_unsigned()) return static_cast<int64_t>(j.get<uint64_t>());
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v >= 0) return v;
  }
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size() && v >= 0) return v;
  }
  return InvalidArgumentError("{}: '{}' must be a non-negative integer, got {}", where, key, j.dump());
}

StatusOr<bool> GetBool(const json& j, std::string_view key, std::string_view where) {
  if (j.is_boolean()) return j.get<bool>();
  return InvalidArgumentError("{}: '{}' must be true or false, got {}", where, key, j.dump());
}

StatusOr<QueuePolicy> ParsePolicy(const json& j, std::string_view where) {
  if (!j.is_object()) return InvalidArgumentError("{}: a queue policy must be an object", where);
  QueuePolicy p;
  for (const auto& [key, v] : j.items()) {
    if (key == "timeout_action") {
      const std::string a = v.is_string() ? v.get<std::string>() : "";
      if (a == "REJECT") {
        p.timeout_action = TimeoutAction::kReject;
      } else if (a == "DELAY") {
        p.timeout_action = TimeoutAction::kDelay;
      } else {
        return InvalidArgumentError("{}: timeout_action must be \"REJECT\" or \"DELAY\", got {}", where,
                                    v.dump());
      }
    } else if (key == "default_timeout_microseconds") {
      ASSIGN_OR_RETURN(p.default_timeout_us, GetUint(v, key, where));
    } else if (key == "allow_timeout_override") {
      ASSIGN_OR_RETURN(p.allow_timeout_override, GetBool(v, key, where));
    } else if (key == "max_queue_size") {
      ASSIGN_OR_RETURN(int64_t n, GetUint(v, key, where));
      p.max_queue_size = static_cast<int>(std::min<int64_t>(n, 1 << 30));
    } else {
      return InvalidArgumentError("{}: unknown queue policy key '{}'", where, key);
    }
  }
  return p;
}

json PolicyJson(const QueuePolicy& p) {
  return json{{"timeout_action", p.timeout_action == TimeoutAction::kReject ? "REJECT" : "DELAY"},
              {"default_timeout_microseconds", p.default_timeout_us},
              {"allow_timeout_override", p.allow_timeout_override},
              {"max_queue_size", p.max_queue_size}};
}

StatusOr<DynamicBatchingOptions> ParseDynamicBatching(const json& j, std::string_view source) {
  const std::string where = fmt::format("{}: dynamic_batching", source);
  if (!j.is_object()) return InvalidArgumentError("{} must be an object", where);
  DynamicBatchingOptions d;
  for (const auto& [key, v] : j.items()) {
    if (key == "preferred_batch_size") {
      if (!v.is_array()) return InvalidArgumentError("{}: preferred_batch_size must be a list", where);
      for (const json& x : v) {
        ASSIGN_OR_RETURN(int64_t n, GetUint(x, key, where));
        d.preferred_batch_sizes.push_back(static_cast<int>(std::min<int64_t>(n, 1 << 30)));
      }
    } else if (key == "max_queue_delay_microseconds") {
      ASSIGN_OR_RETURN(d.max_queue_delay_us, GetUint(v, key, where));
    } else if (key == "priority_levels") {
      ASSIGN_OR_RETURN(int64_t n, GetUint(v, key, where));
      d.priority_levels = static_cast<int>(std::min<int64_t>(n, 1 << 20));
    } else if (key == "default_priority_level") {
      ASSIGN_OR_RETURN(int64_t n, GetUint(v, key, where));
      d.default_priority_level = static_cast<int>(std::min<int64_t>(n, 1 << 20));
    } else if (key == "default_queue_policy") {
      ASSIGN_OR_RETURN(d.default_queue_policy, ParsePolicy(v, where + ".default_queue_policy"));
    } else if (key == "priority_queue_policy") {
      if (!v.is_object()) return InvalidArgumentError("{}: priority_queue_policy must be an object", where);
      for (const auto& [level, pj] : v.items()) {
        ASSIGN_OR_RETURN(int64_t n, GetUint(json(level), "priority_queue_policy", where));
        ASSIGN_OR_RETURN(QueuePolicy p,
                         ParsePolicy(pj, fmt::format("{}.priority_queue_policy.{}", where, level)));
        d.priority_queue_policy[static_cast<int>(std::min<int64_t>(n, 1 << 20))] = p;
      }
    } else if (key == "max_batch_tokens") {
      ASSIGN_OR_RETURN(d.max_batch_tokens, GetUint(v, key, where));
    } else if (key == "preserve_ordering") {
      // Responses go back per request as each completes; accepted for compatibility, has no effect.
    } else {
      return InvalidArgumentError("{}: unknown key '{}'", where, key);
    }
  }
  return d;
}

}  // namespace

const QueuePolicy& DynamicBatchingOptions::PolicyFor(int level) const {
  auto it = priority_queue_policy.find(level);
  return it != priority_queue_policy.end() ? it->second : default_queue_policy;
}

Status BatcherConfig::Validate() const {
  if (max_batch_size < 0) return InvalidArgumentError("max_batch_size must be >= 0");
  if (instance_count < 1 || instance_count > 256) {
    return InvalidArgumentError("instance_group count must be in [1, 256], got {}", instance_count);
  }
  if (!dynamic_batching) return OkStatus();
  const DynamicBatchingOptions& d = *dynamic_batching;
  for (int p : d.preferred_batch_sizes) {
    if (p < 1 || (max_batch_size > 0 && p > max_batch_size)) {
      return InvalidArgumentError("preferred_batch_size {} must be in [1, max_batch_size={}]", p,
                                  max_batch_size);
    }
  }
  if (d.max_queue_delay_us > int64_t{3600} * 1000000) {
    return InvalidArgumentError("max_queue_delay_microseconds {} is over an hour", d.max_queue_delay_us);
  }
  if (d.priority_levels > 0) {
    if (d.default_priority_level < 1 || d.default_priority_level > d.priority_levels) {
      return InvalidArgumentError("default_priority_level {} must be in [1, priority_levels={}]",
                                  d.default_priority_level, d.priority_levels);
    }
  } else if (d.default_priority_level != 0) {
    return InvalidArgumentError("default_priority_level needs priority_levels > 0");
  }
  for (const auto& [level, p] : d.priority_queue_policy) {
    if (level < 1 || level > d.priority_levels) {
      return InvalidArgumentError("priority_queue_policy level {} must be in [1, priority_levels={}]", level,
                                  d.priority_levels);
    }
  }
  return OkStatus();
}

StatusOr<BatcherConfig> BatcherConfig::FromJson(const json& j, std::string_view source) {
  if (!j.is_object()) return InvalidArgumentError("{}: expected a JSON object", source);
  BatcherConfig c;
  if (j.contains("max_batch_size")) {
    ASSIGN_OR_RETURN(int64_t n, GetUint(j["max_batch_size"], "max_batch_size", source));
    c.max_batch_size = static_cast<int>(std::min<int64_t>(n, 1 << 20));
  }
  if (j.contains("dynamic_batching")) {
    ASSIGN_OR_RETURN(c.dynamic_batching, ParseDynamicBatching(j["dynamic_batching"], source));
  }
  if (j.contains("instance_group")) {
    const json& g = j["instance_group"];
    if (!g.is_array()) return InvalidArgumentError("{}: instance_group must be a list", source);
    int64_t total = 0;
    for (const json& e : g) {
      if (!e.is_object()) return InvalidArgumentError("{}: instance_group entries must be objects", source);
      int64_t count = 1;
      if (e.contains("count")) {
        ASSIGN_OR_RETURN(count, GetUint(e["count"], "count", source));
      }
      total += count;
    }
    c.instance_count = static_cast<int>(std::min<int64_t>(total, 1 << 20));
  }
  if (Status s = c.Validate(); !s.ok()) return s.WithContext(source);
  return c;
}

json BatcherConfig::ToJson() const {
  json j{{"max_batch_size", max_batch_size},
         {"instance_group", json::array({json{{"name", "instance"},
                                              {"kind", "KIND_CPU"},
                                              {"count", instance_count},
                                              {"gpus", json::array()}}})}};
  if (dynamic_batching) {
    const DynamicBatchingOptions& d = *dynamic_batching;
    json db{{"preferred_batch_size", d.preferred_batch_sizes},
            {"max_queue_delay_microseconds", d.max_queue_delay_us},
            {"preserve_ordering", false},
            {"priority_levels", d.priority_levels},
            {"default_priority_level", d.default_priority_level},
            {"default_queue_policy", PolicyJson(d.default_queue_policy)},
            {"max_batch_tokens", d.max_batch_tokens}};
    if (!d.priority_queue_policy.empty()) {
      json pq = json::object();
      for (const auto& [level, p] : d.priority_queue_policy) pq[std::to_string(level)] = PolicyJson(p);
      db["priority_queue_policy"] = pq;
    }
    j["dynamic_batching"] = db;
  }
  return j;
}

}  // namespace stoke
