#include "native/admission.h"

#include <algorithm>

namespace graphmod {

uint64_t CountMinSketch::Add(uint64_t h) {
  uint32_t* cell[kRows];
  uint32_t least = UINT32_MAX;
  for (int r = 0; r < kRows; ++r) {
    cell[r] = &cells_[Cell(h, r)];
    least = std::min(least, *cell[r]);
  }
  const uint32_t next = AddCount(least, 1);
  for (uint32_t* c : cell) *c = std::max(*c, next);
  return next;
}

uint64_t CountMinSketch::Estimate(uint64_t h) const {
  uint32_t least = UINT32_MAX;
  for (int r = 0; r < kRows; ++r) least = std::min(least, cells_[Cell(h, r)]);
  return least;
}

}  // namespace graphmod
