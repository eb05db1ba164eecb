// AUTO's decisions of one generation, by size class, and from which call on
// each takes effect.
//
// A class the workers have not measured on this layout does not wait for
// its probe (auto_topology.h): its calls run at once on a predicted
// topology, the fixed rule's (choose_auto: a function of the class and the
// cluster, so the same on every worker), while the probe runs beside them.
// The measured choice must then replace the prediction on every worker at
// the same call, or one call would run on two topologies and fail. Workers
// issue their calls in their own orders, so "the k-th call of the class" is
// not the same call everywhere, but "the k-th call named N" is (calls of
// one name are matched in order, mailbox.h). So once the probe has decided,
// each worker holds back new calls of the class, contributes the most calls
// it has started under one name, and all take the maximum M (one small
// all-reduce): from then on the k-th call of a name runs on the measured
// choice if k >= M, on the prediction otherwise, on every worker alike.
// Every call started before a worker's contribution has k < M, since M is
// at least that worker's own count.
//
// A name used only once never reaches M: such calls stay on the prediction
// for the generation (the choice is still remembered for the layout's next
// generation, auto_memory.h). A recalled choice, or the fixed rule after a
// failed probe, applies from the first call of every name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "topology.h"

namespace kungfu {

class AutoChoices {
 public:
  using Ready = std::function<void(TopologyKind)>;

  // Calls `ready` (inline, outside the lock) with the topology the call
  // named `name` runs on, if the class can run it now; otherwise keeps it
  // until predict(), settle() or decide(). True iff the caller must start
  // the class's agreement (it is the first to ask).
  bool resolve(int size_class, const std::string &name, Ready ready);
  // The steady state, without resolve()'s callbacks: true, with the
  // topology, if the class has decided and the calls of `name` are past
  // its switch point. Such a call waits for nothing, and its end paces
  // nothing, so it needs neither (they cost 2 of the 4 B all-reduce's
  // 1.8 us at np=2 with the runtime alone). Otherwise false: use resolve().
  bool steady(int size_class, const std::string &name, TopologyKind *kind) const;
  // Nobody recalled a choice for the class: its calls run on `predicted`
  // until settle(), the waiting ones from now.
  void predict(int size_class, TopologyKind predicted);
  // The class's probe has decided: its new calls wait for settle(). Returns
  // this worker's part of the switch point: the most calls it has started
  // under one name.
  uint64_t hold(int size_class);
  // The measured `kind` runs every call of a name from its `from_call`-th
  // on (the maximum of every worker's hold()); earlier ones keep the
  // prediction. Starts the waiting calls; returns how many waited.
  size_t settle(int size_class, TopologyKind kind, uint64_t from_call);
  // The class runs every call on `kind` from now on: a recalled choice
  // (`measured`), or the fixed rule's after a failed agreement or probe
  // (not measured; never retried: its names may hold a peer's abort, which
  // would fail a new attempt at once). Starts the waiting calls; returns
  // how many waited.
  size_t decide(int size_class, TopologyKind kind, bool measured);
  // The classes whose measured (probed or recalled) choice is decided, and
  // that choice.
  std::map<int, TopologyKind> measured() const;

  // `tick` runs after each call of the class ends, the first of each name
  // excepted, until its probe has decided: the probe takes one sample per
  // call (runtime_auto.cc), so its cost spreads over the steps after the
  // first instead of landing on the first, which a cluster change waits for.
  void pace(int size_class, std::function<void()> tick);
  // A call `name` of the class ended: ticks its probe, if one is paced and
  // the name has ended a call before.
  void call_ended(int size_class, const std::string &name);
  // A timed sample of the class's probe runs alone in its class: calls
  // started between these two wait, then run on the prediction. (Beside the
  // class's own traffic, on a slow link, every candidate took about the
  // call's time more and their differences drowned in it.) The calls already
  // under way were started before the sample, so each worker's sample still
  // starts: its credit comes from a call that every worker has entered.
  void sample_started(int size_class);
  // Returns how many calls waited for the sample.
  size_t sample_done(int size_class);

 private:
  enum class State { kAgreeing, kPredicted, kHeld, kDecided };
  struct Class {
    State state = State::kAgreeing;
    TopologyKind predicted = TopologyKind::kStar;
    TopologyKind chosen = TopologyKind::kStar;
    uint64_t from_call = 0;  // calls numbered from here on, per name, run on `chosen`
    bool measured = false;
    bool sampling = false;                            // sample_started() .. sample_done()
    std::map<std::string, uint64_t> started;          // calls per name
    std::map<std::string, uint64_t> ended;            // of those, ended
    std::vector<std::pair<uint64_t, Ready>> waiting;  // each with its number
    std::function<void()> tick;                       // pace()
    TopologyKind kind_for(uint64_t call) const { return call < from_call ? predicted : chosen; }
  };
  // Hands the waiting calls their topology, outside the lock.
  static size_t start(std::vector<std::pair<TopologyKind, Ready>> ready);
  // The class's waiting calls, each with the topology it now runs on.
  static std::vector<std::pair<TopologyKind, Ready>> release(Class &c);

  mutable std::mutex mu_;
  std::map<int, Class> classes_;
};

}  // namespace kungfu
