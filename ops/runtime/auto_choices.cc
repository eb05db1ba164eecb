#include "auto_choices.h"

#include <algorithm>
#include <limits>

namespace kungfu {

bool AutoChoices::resolve(int size_class, const std::string &name, Ready ready) {
  std::unique_lock<std::mutex> lock(mu_);
  Class &c = classes_[size_class];
  const uint64_t call = c.started[name]++;
  if ((c.state == State::kPredicted && !c.sampling) || c.state == State::kDecided) {
    TopologyKind kind = c.kind_for(call);
    lock.unlock();
    ready(kind);
    return false;
  }
  c.waiting.emplace_back(call, std::move(ready));
  return c.state == State::kAgreeing && c.waiting.size() == 1;
}

bool AutoChoices::steady(int size_class, const std::string &name, TopologyKind *kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = classes_.find(size_class);
  if (it == classes_.end() || it->second.state != State::kDecided) return false;
  const Class &c = it->second;
  auto calls = c.started.find(name);
  // The count stops here: nothing reads a decided class's counts again (a
  // cluster change starts a new AutoChoices), and it stays past the point.
  if ((calls == c.started.end() ? 0 : calls->second) < c.from_call) return false;
  *kind = c.chosen;
  return true;
}

void AutoChoices::sample_started(int size_class) {
  std::lock_guard<std::mutex> lock(mu_);
  classes_[size_class].sampling = true;
}

size_t AutoChoices::sample_done(int size_class) {
  std::vector<std::pair<TopologyKind, Ready>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Class &c = classes_[size_class];
    c.sampling = false;
    if (c.state == State::kPredicted) ready = release(c);
  }
  return start(std::move(ready));
}

void AutoChoices::predict(int size_class, TopologyKind predicted) {
  std::vector<std::pair<TopologyKind, Ready>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Class &c = classes_[size_class];
    c.state = State::kPredicted;
    c.predicted = c.chosen = predicted;
    c.from_call = std::numeric_limits<uint64_t>::max();  // until settle()
    ready = release(c);
  }
  start(std::move(ready));
}

uint64_t AutoChoices::hold(int size_class) {
  std::lock_guard<std::mutex> lock(mu_);
  Class &c = classes_[size_class];
  c.state = State::kHeld;
  c.sampling = false;
  c.tick = nullptr;
  uint64_t most = 0;
  for (const auto &[name, calls] : c.started) most = std::max(most, calls);
  return most;
}

size_t AutoChoices::settle(int size_class, TopologyKind kind, uint64_t from_call) {
  std::vector<std::pair<TopologyKind, Ready>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Class &c = classes_[size_class];
    c.state = State::kDecided;
    c.chosen = kind;
    c.from_call = from_call;
    c.measured = true;
    c.sampling = false;
    c.tick = nullptr;
    ready = release(c);
  }
  return start(std::move(ready));
}

size_t AutoChoices::decide(int size_class, TopologyKind kind, bool measured) {
  std::vector<std::pair<TopologyKind, Ready>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Class &c = classes_[size_class];
    c.state = State::kDecided;
    c.predicted = c.chosen = kind;
    c.from_call = 0;
    c.measured = measured;
    c.sampling = false;
    c.tick = nullptr;
    ready = release(c);
  }
  return start(std::move(ready));
}

std::map<int, TopologyKind> AutoChoices::measured() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int, TopologyKind> out;
  for (const auto &[size_class, c] : classes_) {
    if (c.measured) out[size_class] = c.chosen;
  }
  return out;
}

void AutoChoices::pace(int size_class, std::function<void()> tick) {
  std::lock_guard<std::mutex> lock(mu_);
  classes_[size_class].tick = std::move(tick);
}

void AutoChoices::call_ended(int size_class, const std::string &name) {
  std::function<void()> tick;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = classes_.find(size_class);
    if (it == classes_.end()) return;
    if (it->second.ended[name]++ > 0) tick = it->second.tick;
  }
  if (tick) tick();
}

std::vector<std::pair<TopologyKind, AutoChoices::Ready>> AutoChoices::release(Class &c) {
  std::vector<std::pair<TopologyKind, Ready>> out;
  for (auto &[call, ready] : c.waiting) out.emplace_back(c.kind_for(call), std::move(ready));
  c.waiting.clear();
  return out;
}

size_t AutoChoices::start(std::vector<std::pair<TopologyKind, Ready>> ready) {
  for (auto &[kind, r] : ready) r(kind);
  return ready.size();
}

}  // namespace kungfu
