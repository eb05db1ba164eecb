#include "env_values.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace kungfu {

namespace {

std::string quoted(const std::string &variable, const std::string &text) { return variable + "='" + text + "'"; }

}  // namespace

Status parse_timeout_seconds(const std::string &variable, const std::string &text, double *out) {
  double t = 0;
  if (!parse_decimal(text, &t) || t <= 0 || t > kMaxTimeoutSeconds) {
    return InvalidArgument(quoted(variable, text) + ": expected a number of seconds in (0, " +
                           std::to_string(static_cast<long long>(kMaxTimeoutSeconds)) + "]");
  }
  *out = t;
  return Status::OK();
}

bool parse_decimal(const std::string &text, double *out) {
  char *end = nullptr;
  errno = 0;
  double t = std::strtod(text.c_str(), &end);
  // Plain decimal notation only: strtod alone also takes spaces, hex and "nan".
  bool number = !text.empty() && text.find_first_not_of("0123456789.eE+-") == std::string::npos &&
                end != text.c_str() && *end == '\0' && errno == 0 && std::isfinite(t);
  if (number) *out = t;
  return number;
}

Status parse_uint32(const std::string &variable, const std::string &text, uint32_t *out) {
  bool digits = !text.empty() && text.size() <= 10;
  for (char c : text) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  unsigned long long v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
  if (!digits || v > UINT32_MAX) {
    return InvalidArgument(quoted(variable, text) + ": expected a decimal integer from 0 to " +
                           std::to_string(UINT32_MAX));
  }
  *out = static_cast<uint32_t>(v);
  return Status::OK();
}

Status check_job_secret(const std::string &variable, const char *text, size_t size) {
  bool hex = size == 64;
  for (size_t i = 0; i < size; ++i) hex = hex && std::isxdigit(static_cast<unsigned char>(text[i]));
  // The value is never echoed: it is a secret, even when malformed.
  if (!hex) {
    return InvalidArgument(variable + " must be 64 hexadecimal characters (as kungfu-run generates), got " +
                           std::to_string(size) + " characters");
  }
  return Status::OK();
}

}  // namespace kungfu
