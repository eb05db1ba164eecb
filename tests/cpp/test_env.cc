// RuntimeOptions::from_env rejects malformed KUNGFU_* values at start-up,
// naming the variable, instead of reading them as 0, NaN or an overflow.
#include <cstdlib>

#include "env_values.h"
#include "test_util.h"

using namespace kungfu;
using kftest::contains;

namespace {

const char *kSecret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

void set_good_env() {
  setenv("KUNGFU_PEERS", "127.0.0.1:10001,127.0.0.1:10002", 1);
  setenv("KUNGFU_SELF", "127.0.0.1:10002", 1);
  setenv("KUNGFU_JOB_SECRET", kSecret, 1);
  setenv("KUNGFU_JOB_ID", "test-run", 1);
  unsetenv("KUNGFU_TIMEOUT");
  unsetenv("KUNGFU_CLUSTER_VERSION");
  unsetenv("KUNGFU_TOPOLOGY");
  unsetenv("KUNGFU_AUTHENTICATE_FRAMES");
  unsetenv("KUNGFU_AUTO_PROBES");
  unsetenv("KUNGFU_AUTO_PRUNE");
  unsetenv("KUNGFU_AUTO_LOG");
}

// from_env with `variable` set to `value` fails, naming the variable.
void expect_rejected(const char *variable, const char *value) {
  set_good_env();
  setenv(variable, value, 1);
  RuntimeOptions o;
  Status s = RuntimeOptions::from_env(&o);
  if (s.ok()) std::fprintf(stderr, "  %s=%s was accepted\n", variable, value);
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(contains(s.message(), variable));
}

void test_good_values() {
  set_good_env();
  setenv("KUNGFU_TIMEOUT", "2.5", 1);
  setenv("KUNGFU_CLUSTER_VERSION", "4294967295", 1);
  RuntimeOptions o;
  CHECK_OK(RuntimeOptions::from_env(&o));
  CHECK(o.self_rank == 1);
  CHECK(o.timeout_seconds == 2.5);
  CHECK(o.cluster.version() == 4294967295u);
  // Frame authentication: across hosts unless set; 0 and 1 force it.
  CHECK(o.frame_auth == FrameAuthPolicy::kAcrossHosts);
  for (auto [value, policy] : {std::pair{"0", FrameAuthPolicy::kNever}, std::pair{"1", FrameAuthPolicy::kAlways}}) {
    setenv("KUNGFU_AUTHENTICATE_FRAMES", value, 1);
    RuntimeOptions forced;
    CHECK_OK(RuntimeOptions::from_env(&forced));
    CHECK(forced.frame_auth == policy);
  }
  // AUTO measures by default; 0 turns the probe off.
  CHECK(o.auto_probes == 3);
  for (auto [value, probes] : {std::pair{"0", 0}, std::pair{"7", 7}, std::pair{"100", 100}}) {
    setenv("KUNGFU_AUTO_PROBES", value, 1);
    RuntimeOptions set;
    CHECK_OK(RuntimeOptions::from_env(&set));
    CHECK(set.auto_probes == probes);
  }
  // Large classes' probes prune at 1.5x by default; 0 keeps every candidate.
  CHECK(o.auto_prune == 1.5);
  for (auto [value, ratio] :
       {std::pair{"0", 0.0}, std::pair{"1", 1.0}, std::pair{"1.5", 1.5}, std::pair{"100", 100.0}}) {
    setenv("KUNGFU_AUTO_PRUNE", value, 1);
    RuntimeOptions set;
    CHECK_OK(RuntimeOptions::from_env(&set));
    CHECK(set.auto_prune == ratio);
  }
  unsetenv("KUNGFU_AUTO_PRUNE");
  // AUTO's probes are silent unless KUNGFU_AUTO_LOG=1.
  CHECK(!o.auto_log);
  for (auto [value, on] : {std::pair{"0", false}, std::pair{"1", true}}) {
    setenv("KUNGFU_AUTO_LOG", value, 1);
    RuntimeOptions set;
    CHECK_OK(RuntimeOptions::from_env(&set));
    CHECK(set.auto_log == on);
  }
}

void test_bad_values() {
  for (const char *v : {"nan", "inf", "-inf", "0", "-1", "1e300", "1e7", "10s", "", " 5", "0x10"}) {
    if (*v) expect_rejected("KUNGFU_TIMEOUT", v);
  }
  for (const char *v : {"abc", "-1", "4294967296", "1.5", "99999999999", "12a"})
    expect_rejected("KUNGFU_CLUSTER_VERSION", v);
  for (const char *v : {"x", "short", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeg"}) {
    expect_rejected("KUNGFU_JOB_SECRET", v);
  }
  // The secret is never echoed, even when it is malformed.
  set_good_env();
  setenv("KUNGFU_JOB_SECRET", "my-precious-password", 1);
  RuntimeOptions o;
  Status s = RuntimeOptions::from_env(&o);
  CHECK(!s.ok() && !contains(s.message(), "precious"));
  for (const char *v : {"yes", "true", "2"}) expect_rejected("KUNGFU_AUTHENTICATE_FRAMES", v);
  for (const char *v : {"yes", "on", "2", " 1"}) expect_rejected("KUNGFU_AUTO_LOG", v);
  expect_rejected("KUNGFU_SELF", "127.0.0.1:10009");
  expect_rejected("KUNGFU_SELF", "nonsense");
  for (const char *v : {"abc", "-1", "101", "1.5", "3 ", "4294967296"}) {
    expect_rejected("KUNGFU_AUTO_PROBES", v);
    set_good_env();
    setenv("KUNGFU_AUTO_PROBES", v, 1);
    Status rejected = RuntimeOptions::from_env(&o);
    CHECK(contains(rejected.message(), std::string("KUNGFU_AUTO_PROBES='") + v + "'"));
    CHECK(contains(rejected.message(), "from 0 to 100"));
  }
  // Below 1 a ratio would prune the fastest candidate itself.
  for (const char *v : {"0.5", "-2", "101", "nan", "inf", "2x", " 2", "0x2"}) {
    expect_rejected("KUNGFU_AUTO_PRUNE", v);
    set_good_env();
    setenv("KUNGFU_AUTO_PRUNE", v, 1);
    Status rejected = RuntimeOptions::from_env(&o);
    CHECK(contains(rejected.message(), std::string("KUNGFU_AUTO_PRUNE='") + v + "'"));
    CHECK(contains(rejected.message(), "from 1 to 100"));
  }
}

}  // namespace

int main() {
  return kftest::run_tests({
      {"good_values", test_good_values},
      {"bad_values", test_bad_values},
  });
}
