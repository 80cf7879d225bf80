#include "native/cold_index.h"

#include <algorithm>
#include <utility>

namespace graphmod {

namespace {
constexpr size_t kMinIndexCapacity = 16;
}

size_t ColdIndex::Distance(size_t i) const {
  const size_t home = Home(slots()[i].key);
  return i >= home ? i - home : i + capacity_ - home;
}

ColdIndex::Slot* ColdIndex::Find(int64_t key) {
  if (size_ == 0) return nullptr;
  Slot* s = slots();
  size_t i = Home(key);
  for (size_t d = 0;; ++d) {
    if (s[i].segment == kEmpty) return nullptr;
    if (s[i].key == key) return &s[i];
    // Robin Hood order: had key been here, it would sit before any slot
    // nearer its own home than we are to key's.
    if (Distance(i) < d) return nullptr;
    if (++i == capacity_) i = 0;
  }
}

ColdIndex::Slot* ColdIndex::Place(const Slot& slot) {
  Slot cur = slot;
  Slot* s = slots();
  Slot* placed = nullptr;  // where `slot` itself ends up
  size_t i = Home(cur.key);
  for (size_t d = 0;; ++d) {
    if (s[i].segment == kEmpty) {
      s[i] = cur;
      ++size_;
      return placed != nullptr ? placed : &s[i];
    }
    const size_t di = Distance(i);
    if (di < d) {  // the resident is richer (nearer home): it moves on
      std::swap(cur, s[i]);
      if (placed == nullptr) placed = &s[i];
      d = di;
    }
    if (++i == capacity_) i = 0;
  }
}

ColdIndex::Slot* ColdIndex::Upsert(int64_t key, bool* added) {
  if (Slot* s = Find(key)) {
    *added = false;
    return s;
  }
  Reserve(size_ + 1);
  *added = true;
  Slot slot{};
  slot.key = key;
  slot.segment = 0;  // anything but kEmpty; the caller sets the location
  return Place(slot);
}

void ColdIndex::Reserve(size_t n) {
  if (n * 8 <= capacity_ * 7) return;
  Rehash(std::max({kMinIndexCapacity, capacity_ + capacity_ / 2, n * 8 / 7 + 1}));
}

bool ColdIndex::Erase(int64_t key, Slot* old) {
  Slot* f = Find(key);
  if (f == nullptr) return false;
  if (old != nullptr) *old = *f;
  Slot* s = slots();
  // Backward shift: pull the following displaced slots one step nearer home,
  // so no tombstone is left and probes stay short.
  size_t i = static_cast<size_t>(f - s);
  for (;;) {
    const size_t j = i + 1 == capacity_ ? 0 : i + 1;
    if (s[j].segment == kEmpty || Distance(j) == 0) break;
    s[i] = s[j];
    i = j;
  }
  s[i].segment = kEmpty;
  --size_;
  if (capacity_ > 4 * kMinIndexCapacity && size_ * 4 < capacity_)
    Rehash(std::max(kMinIndexCapacity, size_ * 2));
  return true;
}

void ColdIndex::Clear() {
  slots_.reset();
  capacity_ = 0;
  size_ = 0;
}

void ColdIndex::Rehash(size_t capacity) {
  Memory fresh = AllocateAligned(capacity * sizeof(Slot));  // may throw: nothing changed yet
  Memory old = std::move(slots_);
  const size_t old_capacity = capacity_;
  slots_ = std::move(fresh);
  capacity_ = capacity;
  size_ = 0;
  Slot* s = slots();
  for (size_t i = 0; i < capacity_; ++i) s[i].segment = kEmpty;
  const Slot* o = reinterpret_cast<const Slot*>(old.get());
  for (size_t i = 0; i < old_capacity; ++i)
    if (o[i].segment != kEmpty) Place(o[i]);
}

}  // namespace graphmod
