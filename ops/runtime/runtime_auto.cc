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

// One probe's progress. Samples run one after another, each `calls`
// all-reduces of one candidate, following `plan`: first an untimed warm-up
// of every candidate (connections open), then timed samples, candidates
// interleaved so that a change of machine load touches all of them alike.
// A pruned probe plans the first timed sample of every candidate, agrees on
// the survivors (auto_survivors), then plans the rest for them alone.
struct Probe {
  struct Slot {
    size_t candidate;
    int sample;  // 0: the warm-up
  };
  int size_class = 0;
  std::vector<TopologyKind> candidates;
  int samples = 0;
  int calls = 0;  // all-reduces per sample
  std::vector<float> in, out;
  std::vector<std::vector<double>> seconds;  // per candidate, per timed sample
  std::vector<Slot> plan;
  size_t next = 0;             // the slot under way
  int call = 0;                // its all-reduce under way
  int64_t sequence = 0;        // names the probe's all-reduces, the same on every worker
  bool prune_pending = false;  // the survivors are still to be agreed after `plan`
  bool alone = false;          // timed samples hold the class's new calls (AutoChoices::sample_started)
  int32_t align = 0;           // all-reduced before each such sample, to start it together
  std::vector<size_t> survivors;
  std::chrono::steady_clock::time_point sample_start;
  std::vector<double> totals;  // per candidate, summed over the workers
  TopologyKind best = TopologyKind::kStar;
  TopologyKind predicted = TopologyKind::kStar;  // the fixed rule's, which keeps near-ties (auto_verdict)
  // Pacing: a sample starts only when a call of the class has ended since
  // the last one started (a credit); otherwise the probe parks until one does.
  std::mutex pace_mu;
  int credits = 0;
  bool parked = false;
  int64_t switch_call = 0;  // this worker's hold(), then the maximum over the workers

  // Samples first..last of every candidate in `which`.
  void plan_samples(const std::vector<size_t> &which, int first, int last) {
    plan.clear();
    next = 0;
    for (int sample = first; sample <= last; ++sample) {
      for (size_t c : which) plan.push_back(Slot{c, sample});
    }
  }
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
    const bool kept = std::find(p.survivors.begin(), p.survivors.end(), i) != p.survivors.end();
    char cell[80];
    std::snprintf(cell, sizeof(cell), " %s %.2f us%s", topology_name(p.candidates[i]), p.totals[i] / g.size() * 1e6,
                  kept ? "" : " (pruned after one sample)");
    line += cell;
  }
  line += std::string(" -> ") + topology_name(best);
  if (best == p.predicted && best != fastest(p.candidates, p.totals, p.survivors)) {
    line += " (the prediction, within " +
            std::to_string(static_cast<int>((auto_keep_prediction(p.size_class) - 1) * 100 + 0.5)) +
            " % of the fastest)";
  }
  line += "\n";
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
  std::vector<size_t> all(p->candidates.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  p->survivors = all;
  // Pruning needs a timed sample to judge by and one more to run after it.
  p->prune_pending = opt_.auto_prune > 0 && size_class >= kAutoPruneMinClass && p->samples > 1;
  // Every timed sample runs alone and from a common start, small ones too:
  // a 4 B sample that began while a peer was still dispatching its own call
  // measured that peer's lag (29 us for STAR, 2 us for the others, in a
  // tf.function at np=2), not the topology.
  p->alone = true;
  p->plan_samples(all, 0, p->prune_pending ? 1 : p->samples);
  // Weak: the tick lives in the generation, which must not keep itself alive.
  std::weak_ptr<Generation> weak = g;
  g->auto_choices.pace(size_class, [this, weak, p] {
    if (GenPtr live = weak.lock()) probe_tick(live, p);
  });
  // Only now may the class's calls run: every call that ends must find the
  // probe paced, on every worker alike, or one worker would count a credit
  // that another missed, and a sample holding the class's calls
  // (AutoChoices::sample_started) would wait for a peer that waits for them.
  g->auto_choices.predict(size_class, choose_auto(auto_probe_bytes(size_class), g->cluster));
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
  if (p->next == p->plan.size()) return p->prune_pending ? probe_prune(g, state) : probe_decide(g, state);
  const Probe::Slot slot = p->plan[p->next];
  bool align = false;
  if (p->call == 0) {
    // A timed sample waits for a credit; the warm-ups (small) run together
    // under the first one, so that a probe costs the class's calls one
    // sample each, not one per candidate more.
    std::lock_guard<std::mutex> lock(p->pace_mu);
    if (slot.sample > 0 || p->next == 0) {
      if (p->credits == 0) {
        p->parked = true;  // probe_tick() resumes it
        return;
      }
      --p->credits;
    }
    ++auto_probe_samples_;
    if (slot.sample > 0 && p->alone) {
      g->auto_choices.sample_started(p->size_class);
      align = true;
    }
    p->sample_start = std::chrono::steady_clock::now();
  }
  auto run = [this, g, p, slot] {
    TopologyKind kind = p->candidates[slot.candidate];
    size_t count = (slot.sample == 0 ? auto_warmup_bytes(p->size_class) : auto_probe_bytes(p->size_class)) /
                   sizeof(float);
    Buffer buf{p->in.data(), p->out.data(), TensorDesc{DType::kFloat32, {static_cast<int64_t>(count)}, count}, p};
    all_reduce_in(g, kind, p->name(std::to_string(p->sequence++)), buf, ReduceOp::kSum,
                  [this, g, p, slot](const Status &s) {
                    if (!s.ok()) return probe_failed(g, p->size_class);
                    if (++p->call < p->calls) return probe_step(g, p);
                    if (slot.sample > 0) {
                      std::chrono::duration<double> took = std::chrono::steady_clock::now() - p->sample_start;
                      p->seconds[slot.candidate].push_back(took.count() / p->calls);
                      if (p->alone) auto_calls_held_ += g->auto_choices.sample_done(p->size_class);
                    }
                    p->call = 0;
                    ++p->next;
                    probe_step(g, p);
                  });
  };
  if (!align) return run();
  // A sample is timed from a common start: each worker reaches it when its
  // own last call of the class ended, and those ends lie apart (a slow link,
  // a peer still dispatching its call), time that would be charged to the
  // sample.
  Buffer flag{&p->align, &p->align, TensorDesc{DType::kInt32, {1}, 1}, p};
  all_reduce_in(g, TopologyKind::kStar, p->name("align/" + std::to_string(p->sequence)), flag, ReduceOp::kMax,
                [this, g, p, run](const Status &s) {
                  if (!s.ok()) return probe_failed(g, p->size_class);
                  p->sample_start = std::chrono::steady_clock::now();
                  run();
                });
}

void Runtime::probe_prune(const GenPtr &g, const std::shared_ptr<void> &state) {
  auto p = std::static_pointer_cast<Probe>(state);
  // Each candidate's first timed sample, summed over the workers: the same
  // sums everywhere, hence the same survivors.
  p->totals.clear();
  for (const std::vector<double> &s : p->seconds) p->totals.push_back(s.empty() ? 0 : s.front());
  size_t n = p->totals.size();
  Buffer buf{p->totals.data(), p->totals.data(), TensorDesc{DType::kFloat64, {static_cast<int64_t>(n)}, n}, p};
  all_reduce_in(g, TopologyKind::kStar, p->name("prune"), buf, ReduceOp::kSum, [this, g, p](const Status &s) {
    if (!s.ok()) return probe_failed(g, p->size_class);
    p->survivors = auto_survivors(p->totals, opt_.auto_prune);
    p->prune_pending = false;
    p->plan_samples(p->survivors, 2, p->samples);
    probe_step(g, p);
  });
}

void Runtime::probe_decide(const GenPtr &g, const std::shared_ptr<void> &state) {
  auto p = std::static_pointer_cast<Probe>(state);
  // Each worker's median per candidate, summed over the workers: every
  // worker gets the same sums, hence the same choice. A pruned candidate's
  // one sample is summed too (for the log), but it cannot be chosen.
  p->totals.clear();
  for (const std::vector<double> &s : p->seconds) p->totals.push_back(median(s));
  size_t n = p->totals.size();
  Buffer buf{p->totals.data(), p->totals.data(), TensorDesc{DType::kFloat64, {static_cast<int64_t>(n)}, n}, p};
  all_reduce_in(g, TopologyKind::kStar, p->name("decide"), buf, ReduceOp::kSum, [this, g, p](const Status &s) {
    if (!s.ok()) return probe_failed(g, p->size_class);
    p->predicted = choose_auto(auto_probe_bytes(p->size_class), g->cluster);
    p->best = auto_verdict(p->candidates, p->totals, p->survivors, p->predicted, auto_keep_prediction(p->size_class));
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
    ++poll_epoch_;  // before the held calls are released (runtime_poll.cc)
    auto_calls_waited_ += g->auto_choices.settle(p->size_class, p->best, static_cast<uint64_t>(p->switch_call));
  });
}

void Runtime::probe_failed(const GenPtr &g, int size_class) {
  // The class stays on the fixed rule, the prediction its calls ran on; the
  // calls that waited run on it and fail (or not) on their own, with their
  // own names in the error, as they did before AUTO measured.
  ++poll_epoch_;  // the calls its samples held may have used up their budgets too
  auto_calls_waited_ += g->auto_choices.decide(size_class, choose_auto(auto_probe_bytes(size_class), g->cluster),
                                               false);
}

}  // namespace kungfu
