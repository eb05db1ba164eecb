// Parsing of the values workers read from their environment (KUNGFU_*).
// Each parser rejects anything but a well-formed value, and its error names
// the variable and quotes what it holds, so a typo fails at start-up instead
// of becoming 0, NaN or an overflow later.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "status.h"

namespace kungfu {

// The longest timeout accepted: about 11.6 days. Far above any sensible
// value, and far below where seconds stop fitting int64 nanoseconds.
constexpr double kMaxTimeoutSeconds = 1e6;

// A finite number of seconds in (0, kMaxTimeoutSeconds].
Status parse_timeout_seconds(const std::string &variable, const std::string &text, double *out);
// A finite number in plain decimal notation (no spaces, hex, inf or nan); false otherwise.
bool parse_decimal(const std::string &text, double *out);
// A decimal integer in [0, 2^32).
Status parse_uint32(const std::string &variable, const std::string &text, uint32_t *out);
// The job secret as kungfu-run generates it: 64 hexadecimal characters.
Status check_job_secret(const std::string &variable, const char *text, size_t size);

}  // namespace kungfu
