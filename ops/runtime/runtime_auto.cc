// AUTO's probe (auto_topology.h): recalls the class's choice if the workers
// measured this layout before (auto_memory.h); otherwise lets the class's
// calls run on the fixed rule's prediction, times every candidate topology
// on the size class beside them, one sample after each call of the class,
// agrees on the fastest with one all-reduce of the timings and on the call
// it takes over from with another (auto_choices.h).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>

#include "runtime.h"

namespace kungfu {

namespace {

// One probe's progress. Steps run one after another: sample 0 of every
// candidate is a warm-up (connections open, buffers are allocated) and is
// not timed; samples 1..samples are, candidates interleaved so that a change
// of machine load touches all of them alike.
struct Probe {
  int size_class = 0;
  std::vector<TopologyKind> candidates;
  int samples = 0;
  int calls = 0;  // all-reduces per sample
  std::vector<float> in, out;
  std::vector<std::vector<double>> seconds;  // per candidate, per timed sample
  int step = 0;
  std::chrono::steady_clock::time_point sample_start;
  std::vector<double> totals;  // per candidate, summed over the workers
  TopologyKind best = TopologyKind::kStar;
  // Pacing: a sample starts only when a call of the class has ended since
  // the last one started (a credit); otherwise the probe parks until one does.
  std::mutex pace_mu;
  int credits = 0;
  bool parked = false;
  int64_t switch_call = 0;  // this worker's hold(), then the maximum over the workers

  int steps() const { return (samples + 1) * static_cast<int>(candidates.size()) * calls; }
  int call() const { return step % calls; }
  int candidate() const { return step / calls % static_cast<int>(candidates.size()); }
  int sample() const { return step / calls / static_cast<int>(candidates.size()); }
  // Names never seen by user code ('\x01'), the same on every worker.
  std::string name(const std::string &what) const {
    return "\x01"
           "auto-probe/" +
           std::to_string(size_class) + "/" + what;
  }
};

// One line per decided probe on rank 0 (KUNGFU_AUTO_LOG=1): each candidate's
// time per call, the workers' medians averaged, and the choice.
void log_probe(const Generation &g, const Probe &p, TopologyKind best) {
  std::string line = "[kungfu] AUTO probe, " + std::to_string(auto_probe_bytes(p.size_class)) +
                     " B at np=" + std::to_string(g.size()) + ":";
  for (size_t i = 0; i < p.candidates.size() && i < p.totals.size(); ++i) {
    char cell[64];
    std::snprintf(cell, sizeof(cell), " %s %.2f us", topology_name(p.candidates[i]), p.totals[i] / g.size() * 1e6);
    line += cell;
  }
  line += std::string(" -> ") + topology_name(best) + "\n";
  std::fputs(line.c_str(), stderr);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

void Runtime::probe_auto(const GenPtr &g, int size_class) {
  // First the workers pool what they remember of this layout (auto_memory.h):
  // one small all-reduce, the same sums everywhere, hence the same verdict.
  const std::string layout = auto_layout(g->cluster);
  AutoMemory::Vote mine = AutoMemory::vote(auto_memory_.recall(size_class, layout));
  auto votes = std::make_shared<std::vector<int32_t>>(std::vector<int32_t>{mine.first, mine.second});
  Buffer buf{votes->data(), votes->data(), TensorDesc{DType::kInt32, {2}, 2}, votes};
  const std::string name =
      "\x01"
      "auto-recall/" +
      std::to_string(size_class);
  all_reduce_in(g, TopologyKind::kStar, name, buf, ReduceOp::kMax,
                [this, g, size_class, layout, votes](const Status &s) {
                  if (!s.ok()) return probe_failed(g, size_class);
                  std::optional<TopologyKind> known = AutoMemory::agreed({(*votes)[0], (*votes)[1]});
                  if (known) {
                    auto_memory_.remember(size_class, layout, *known);  // a joiner learns it too
                    g->auto_choices.decide(size_class, *known, true);
                    return;
                  }
                  // Counted before the calls start, so that a caller who
                  // sees its call done also sees the probe it started.
                  ++auto_probes_;
                  g->auto_choices.predict(size_class, choose_auto(auto_probe_bytes(size_class), g->cluster));
                  start_probe(g, size_class);
                });
}

void Runtime::start_probe(const GenPtr &g, int size_class) {
  auto p = std::make_shared<Probe>();
  p->size_class = size_class;
  p->candidates = auto_candidates(g->cluster);
  p->samples = opt_.auto_probes;
  p->calls = auto_calls_per_sample(size_class);
  size_t count = auto_probe_bytes(size_class) / sizeof(float);
  p->in.assign(count, 1.0f);
  p->out.assign(count, 0.0f);
  p->seconds.resize(p->candidates.size());
  // Weak: the tick lives in the generation, which must not keep itself alive.
  std::weak_ptr<Generation> weak = g;
  g->auto_choices.pace(size_class, [this, weak, p] {
    if (GenPtr live = weak.lock()) probe_tick(live, p);
  });
  probe_step(g, p);
}

void Runtime::probe_tick(const GenPtr &g, const std::shared_ptr<void> &state) {
  auto p = std::static_pointer_cast<Probe>(state);
  bool resume;
  {
    std::lock_guard<std::mutex> lock(p->pace_mu);
    ++p->credits;
    resume = p->parked;
    p->parked = false;
  }
  if (resume) probe_step(g, p);
}

void Runtime::probe_step(const GenPtr &g, const std::shared_ptr<void> &state) {
  auto p = std::static_pointer_cast<Probe>(state);
  if (p->step == p->steps()) return probe_decide(g, state);
  if (p->call() == 0) {
    std::lock_guard<std::mutex> lock(p->pace_mu);
    if (p->credits == 0) {
      p->parked = true;  // probe_tick() resumes it
      return;
    }
    --p->credits;
    ++auto_probe_samples_;
    p->sample_start = std::chrono::steady_clock::now();
  }
  TopologyKind kind = p->candidates[static_cast<size_t>(p->candidate())];
  size_t count = p->in.size();
  Buffer buf{p->in.data(), p->out.data(), TensorDesc{DType::kFloat32, {static_cast<int64_t>(count)}, count}, p};
  all_reduce_in(g, kind, p->name(std::to_string(p->step)), buf, ReduceOp::kSum, [this, g, p](const Status &s) {
    if (!s.ok()) return probe_failed(g, p->size_class);
    if (p->sample() > 0 && p->call() == p->calls - 1) {
      std::chrono::duration<double> took = std::chrono::steady_clock::now() - p->sample_start;
      p->seconds[static_cast<size_t>(p->candidate())].push_back(took.count() / p->calls);
    }
    ++p->step;
    probe_step(g, p);
  });
}

void Runtime::probe_decide(const GenPtr &g, const std::shared_ptr<void> &state) {
  auto p = std::static_pointer_cast<Probe>(state);
  // Each worker's median per candidate, summed over the workers: every
  // worker gets the same sums, hence the same choice.
  for (const std::vector<double> &s : p->seconds) p->totals.push_back(median(s));
  size_t n = p->totals.size();
  Buffer buf{p->totals.data(), p->totals.data(), TensorDesc{DType::kFloat64, {static_cast<int64_t>(n)}, n}, p};
  all_reduce_in(g, TopologyKind::kStar, p->name("decide"), buf, ReduceOp::kSum, [this, g, p](const Status &s) {
    if (!s.ok()) return probe_failed(g, p->size_class);
    p->best = fastest(p->candidates, p->totals);
    if (opt_.auto_log && g->self_rank == 0) log_probe(*g, *p, p->best);
    probe_switch(g, p);
  });
}

void Runtime::probe_switch(const GenPtr &g, const std::shared_ptr<void> &state) {
  auto p = std::static_pointer_cast<Probe>(state);
  // The call from which the choice applies, per name: the most calls any
  // worker started under one name before it stopped starting them.
  p->switch_call = static_cast<int64_t>(g->auto_choices.hold(p->size_class));
  Buffer buf{&p->switch_call, &p->switch_call, TensorDesc{DType::kInt64, {1}, 1}, p};
  all_reduce_in(g, TopologyKind::kStar, p->name("switch"), buf, ReduceOp::kMax, [this, g, p](const Status &s) {
    if (!s.ok()) return probe_failed(g, p->size_class);
    auto_memory_.remember(p->size_class, auto_layout(g->cluster), p->best);
    auto_calls_waited_ += g->auto_choices.settle(p->size_class, p->best, static_cast<uint64_t>(p->switch_call));
  });
}

void Runtime::probe_failed(const GenPtr &g, int size_class) {
  // The class stays on the fixed rule, the prediction its calls ran on; the
  // calls that waited run on it and fail (or not) on their own, with their
  // own names in the error, as they did before AUTO measured.
  auto_calls_waited_ += g->auto_choices.decide(size_class, choose_auto(auto_probe_bytes(size_class), g->cluster),
                                               false);
}

}  // namespace kungfu
