// Dropping a store's entries by name prefix (a sync's state pieces, a
// replaced strategy plan's blobs, accumulators and tables).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kungfu {

// Moves the value of every entry of `map` whose key starts with `prefix` into
// the returned vector and erases the entry. The caller holds its lock while
// this runs and lets the vector go after releasing it: the values can be tens
// of megabytes, freed outside the lock.
template <typename Map>
std::vector<typename Map::mapped_type> take_by_prefix(Map &map, const std::string &prefix) {
  std::vector<typename Map::mapped_type> taken;
  for (auto it = map.begin(); it != map.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      taken.push_back(std::move(it->second));
      it = map.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

}  // namespace kungfu
