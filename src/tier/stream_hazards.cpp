#include "stream_hazards.h"

#include <algorithm>

#include "tiermoe/core/error.h"

namespace tiermoe {

LaneWaits StreamHazards::add(uint64_t seq, Lane lane, std::span<const MemAccess> accesses) {
  LaneWaits wait{};
  for (const MemAccess& a : accesses) {
    if (a.begin >= a.end) continue;
    std::vector<Record>& recs = by_buffer_[a.buffer];
    for (const Record& r : recs) {
      TIERMOE_ASSERT(r.seq <= seq, "operation ", seq, " registered after ", r.seq);
      const bool overlap = r.begin < a.end && a.begin < r.end;
      if (!overlap || r.seq == seq || r.lane == lane || !(r.write || a.write)) continue;
      uint64_t& w = wait[size_t(r.lane)];
      w = std::max(w, r.seq);
    }
    // A later access to these bytes conflicts with this one, which waits
    // (or is lane-ordered) after every record it covers: those are spent.
    // A read spends only the earlier reads of its own lane.
    std::erase_if(recs, [&](const Record& r) {
      const bool covered = a.begin <= r.begin && r.end <= a.end;
      return covered && r.seq < seq && (a.write || (!r.write && r.lane == lane));
    });
    recs.push_back(Record{a.begin, a.end, seq, lane, a.write});
  }
  return wait;
}

size_t StreamHazards::records() const {
  size_t n = 0;
  for (const auto& [buffer, recs] : by_buffer_) n += recs.size();
  return n;
}

double covered_seconds(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0, end = 0;
  bool open = false;
  for (const auto& [b, e] : intervals) {
    if (e <= b) continue;
    if (!open || b > end) {
      total += e - b;
      end = e;
      open = true;
    } else if (e > end) {
      total += e - end;
      end = e;
    }
  }
  return total;
}

}  // namespace tiermoe
