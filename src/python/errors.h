// Errors crossing into Python: every absl::Status that is not OK becomes a
// Python exception whose message is the CLI's one line (without the
// "shardwild: error: " prefix), of the class its ErrorKind says:
//
//   shardwild.Error            (Exception)  the base of all of them
//   shardwild.ConfigError      (Error, ValueError)  a config key, value or combination
//   shardwild.DataError        (Error, ValueError)  a data file or array
//   shardwild.CheckpointError  (Error)  no checkpoint, a damaged one, one for another model
//   shardwild.StoreError       (Error)  creating or attaching a store, a bad variable, table or id
//
// The exception's `code` attribute holds the absl status code's name
// ("INVALID_ARGUMENT", "NOT_FOUND", ...).
#pragma once

#include <string>
#include <utility>

#include <pybind11/pybind11.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/status.h"

namespace shardwild::python {

// Thrown by C++ code of the module; the translator RegisterErrors installs
// turns it into the Python class of `kind`. May be thrown without the GIL.
class StatusError : public std::exception {
 public:
  StatusError(absl::Status status, ErrorKind kind) : status_(std::move(status)), kind_(kind) {
    message_ = std::string(status_.message());
  }
  const char* what() const noexcept override { return message_.c_str(); }
  const absl::Status& status() const { return status_; }
  ErrorKind kind() const { return kind_; }

 private:
  absl::Status status_;
  ErrorKind kind_;
  std::string message_;
};

// Throws StatusError for `s` (not OK): its recorded kind, else `fallback`.
[[noreturn]] void Raise(const absl::Status& s, ErrorKind fallback = ErrorKind::kOther);

inline void ThrowIfError(const absl::Status& s, ErrorKind fallback = ErrorKind::kOther) {
  if (!s.ok()) Raise(s, fallback);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> r, ErrorKind fallback = ErrorKind::kOther) {
  if (!r.ok()) Raise(r.status(), fallback);
  return *std::move(r);
}

}  // namespace shardwild::python
