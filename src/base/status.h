// Status and StatusOr: how every layer reports failure. Codes follow gRPC's (and so map onto HTTP codes in
// net/codec). No exceptions cross a library boundary; user input never aborts the process.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

// fmt 9's compile-time format checks do not survive nvcc: .cu files get Status without the fmt
// constructors and build messages themselves (or call host-compiled helpers).
#if !defined(__CUDACC__)
#include <fmt/format.h>
#endif

namespace stoke {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message"
  std::string ToString() const;
  // Returns a copy with "context: " prepended to the message (keeps the code).
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }

#if !defined(__CUDACC__)
// Constructors in the style of absl: InvalidArgument("bad {}", x).
#define STOKE_STATUS_CTOR(Name, Code)                                              \
  template <typename... Args>                                                      \
  Status Name(fmt::format_string<Args...> f, Args&&... args) {                     \
    return Status(StatusCode::Code, fmt::format(f, std::forward<Args>(args)...)); \
  }
STOKE_STATUS_CTOR(InvalidArgumentError, kInvalidArgument)
STOKE_STATUS_CTOR(NotFoundError, kNotFound)
STOKE_STATUS_CTOR(OutOfRangeError, kOutOfRange)
STOKE_STATUS_CTOR(ResourceExhaustedError, kResourceExhausted)
STOKE_STATUS_CTOR(FailedPreconditionError, kFailedPrecondition)
STOKE_STATUS_CTOR(UnimplementedError, kUnimplemented)
STOKE_STATUS_CTOR(InternalError, kInternal)
STOKE_STATUS_CTOR(UnavailableError, kUnavailable)
STOKE_STATUS_CTOR(DataLossError, kDataLoss)
STOKE_STATUS_CTOR(CancelledError, kCancelled)
STOKE_STATUS_CTOR(DeadlineExceededError, kDeadlineExceeded)
STOKE_STATUS_CTOR(AlreadyExistsError, kAlreadyExists)
#undef STOKE_STATUS_CTOR
#endif  // !__CUDACC__

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }  // NOLINT
  StatusOr(T value) : v_(std::move(value)) {}                                                // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace stoke

#define STOKE_CONCAT_INNER(a, b) a##b
#define STOKE_CONCAT(a, b) STOKE_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::stoke::Status _st = (expr);                  \
    if (!_st.ok()) return _st;                     \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MaybeX());
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(STOKE_CONCAT(_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
