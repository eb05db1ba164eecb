// Result of a runtime operation. Codes mirror the TensorFlow error classes the
// kernels map them to, so users see UnavailableError, DeadlineExceededError, ...
#pragma once

#include <string>
#include <utility>

namespace kungfu {

enum class Code {
  kOk = 0,
  kInvalidArgument,     // caller's mistake, e.g. shapes differ across workers
  kNotFound,            // p2p request for a blob nobody saved
  kDeadlineExceeded,    // KUNGFU_TIMEOUT passed while waiting for a peer
  kUnavailable,         // a peer is dead or unreachable
  kFailedPrecondition,  // inconsistent cluster state (topology or version race)
  kPermissionDenied,    // authentication failure
  kInternal,
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status OK() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string &message() const { return message_; }
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
inline Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
inline Status DeadlineExceeded(std::string m) { return Status(Code::kDeadlineExceeded, std::move(m)); }
inline Status Unavailable(std::string m) { return Status(Code::kUnavailable, std::move(m)); }
inline Status FailedPrecondition(std::string m) { return Status(Code::kFailedPrecondition, std::move(m)); }
inline Status PermissionDenied(std::string m) { return Status(Code::kPermissionDenied, std::move(m)); }
inline Status Internal(std::string m) { return Status(Code::kInternal, std::move(m)); }

const char *code_name(Code code);

inline std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(code_name(code_)) + ": " + message_;
}

inline const char *code_name(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
    case Code::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

}  // namespace kungfu
