// Error-handling helpers shared by every layer.
//
// Expected failures travel as absl::Status / absl::StatusOr<T>. Exceptions are
// not used for control flow. Messages are written for the user: they name the
// file, key or line involved and what was expected.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

#define SW_CONCAT_INNER_(a, b) a##b
#define SW_CONCAT_(a, b) SW_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define SW_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status sw_status_ = (expr);          \
    if (!sw_status_.ok()) return sw_status_;     \
  } while (0)

// `lhs = value of expr` where expr is an absl::StatusOr<T>; returns the error otherwise.
#define SW_ASSIGN_OR_RETURN(lhs, expr) \
  SW_ASSIGN_OR_RETURN_IMPL_(SW_CONCAT_(sw_statusor_, __LINE__), lhs, expr)
#define SW_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

namespace shardwild {

// A copy of `s` that shares nothing with it (message and payloads copied).
// For a Status handed from one thread to another: an absl::Status shares its
// message by a reference count that Debian's uninstrumented abseil updates
// out of ThreadSanitizer's sight, so each side keeps a Status of its own.
inline absl::Status DeepCopy(const absl::Status& s) {
  if (s.ok()) return absl::OkStatus();
  absl::Status copy(s.code(), std::string(s.message()));
  s.ForEachPayload([&copy](absl::string_view url, const absl::Cord& payload) {
    copy.SetPayload(url, absl::Cord(std::string(payload)));
  });
  return copy;
}
template <typename T>
absl::StatusOr<T> DeepCopy(const absl::StatusOr<T>& r) {
  if (r.ok()) return r;
  return DeepCopy(r.status());
}

// What an error is about, for callers that sort errors into kinds (the
// Python API raises shardwild.ConfigError, DataError, ...). Carried as a
// payload of the status, so a message stays exactly the CLI's one line.
enum class ErrorKind {
  kOther,       // none recorded
  kConfig,      // the configuration: a key, a value, a combination
  kData,        // a data file or array: missing, unreadable, a bad row
  kCheckpoint,  // a checkpoint: none found, damaged, not matching the model
  kStore,       // the parameter store: creating, attaching, a bad variable, table or id
};

inline constexpr absl::string_view kErrorKindPayload = "type.shardwild.dev/error_kind";

// `s` with `kind` recorded, unless it is OK or already has a kind (the
// innermost one, nearest the cause, wins).
inline absl::Status WithErrorKind(absl::Status s, ErrorKind kind) {
  if (s.ok() || kind == ErrorKind::kOther || s.GetPayload(kErrorKindPayload).has_value()) return s;
  s.SetPayload(kErrorKindPayload, absl::Cord(std::string(1, static_cast<char>('0' + static_cast<int>(kind)))));
  return s;
}
template <typename T>
absl::StatusOr<T> WithErrorKind(absl::StatusOr<T> r, ErrorKind kind) {
  if (r.ok()) return r;
  return WithErrorKind(std::move(r).status(), kind);
}

// The kind recorded in `s`, or kOther.
inline ErrorKind ErrorKindOf(const absl::Status& s) {
  const auto p = s.GetPayload(kErrorKindPayload);
  if (!p.has_value()) return ErrorKind::kOther;
  const std::string v(*p);
  if (v.size() != 1 || v[0] < '0' || v[0] > '4') return ErrorKind::kOther;
  return static_cast<ErrorKind>(v[0] - '0');
}

}  // namespace shardwild
