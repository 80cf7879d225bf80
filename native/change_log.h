// What incremental checkpoints need to know of a shard since the last full
// save: the keys that lost their row or pending count (tombstones), and the
// rows whose version rose above the mark (the version of the last save a
// delta follows), so a delta's export reads what changed, not the table.
// Nothing is noted until Start (a table that never saves deltas pays
// nothing but a branch).
#ifndef GRAPHMOD_NATIVE_CHANGE_LOG_H_
#define GRAPHMOD_NATIVE_CHANGE_LOG_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace graphmod {

class ChangeLog {
 public:
  bool tracking() const { return tracking_; }
  int64_t mark() const { return mark_; }
  void Start(int64_t mark) {
    tracking_ = true;
    mark_ = mark;
  }
  // `key` lost its row or its pending count at table version `version`.
  void NoteRemoved(int64_t key, int64_t version) {
    if (tracking_) removed_.emplace_back(key, version);
  }
  // Before a row's version changes from old_version (a new row's is stale):
  // each row is listed when its version first rises above the mark. Rows
  // freed since stay listed (readers skip them); a row may be listed twice.
  void NoteChanged(uint32_t row, uint32_t old_version, bool added) {
    if (tracking_ && (added || static_cast<int64_t>(old_version) <= mark_)) dirty_.push_back(row);
  }
  void NoteDirty(uint32_t row) { dirty_.push_back(row); }
  // The rows listed as changed, sorted and each once.
  std::vector<uint32_t> DirtyRows() const {
    std::vector<uint32_t> rows = dirty_;
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    return rows;
  }
  // A save made at `since` holds everything noted before it: forgets the
  // removals noted at versions below `since` and, moving the mark up to
  // `since`, the changed rows whose version (version_of(row)) is <= since.
  template <class VersionOf>
  void Forget(int64_t since, const VersionOf& version_of) {
    removed_.erase(std::remove_if(removed_.begin(), removed_.end(),
                                  [since](const std::pair<int64_t, int64_t>& e) {
                                    return e.second < since;
                                  }),
                   removed_.end());
    if (since > mark_) {
      dirty_.erase(std::remove_if(dirty_.begin(), dirty_.end(),
                                  [&](uint32_t row) { return version_of(row) <= since; }),
                   dirty_.end());
      mark_ = since;
    }
  }
  // Keeps the changed-row list within about twice the rows in memory: once
  // it holds more than 2 * live_rows + 4096 entries, drops the rows whose
  // version (version_of(row)) is at or below the mark and the duplicates.
  // Rows moved to disk leave their entries behind (their version is then
  // 0; a delta finds cold rows by the version on disk), so without this the
  // list would grow by an entry per row added until the next full save,
  // whatever the memory budget.
  template <class VersionOf>
  void Trim(size_t live_rows, const VersionOf& version_of) {
    if (dirty_.size() <= 2 * live_rows + 4096) return;
    dirty_.erase(std::remove_if(dirty_.begin(), dirty_.end(),
                                [&](uint32_t row) { return version_of(row) <= mark_; }),
                 dirty_.end());
    std::sort(dirty_.begin(), dirty_.end());
    dirty_.erase(std::unique(dirty_.begin(), dirty_.end()), dirty_.end());
    dirty_.shrink_to_fit();
  }
  const std::vector<std::pair<int64_t, int64_t>>& removed() const { return removed_; }
  // Rows are renumbered (the shard was cleared): the changed-row list goes.
  void ClearDirty() { dirty_.clear(); }

 private:
  bool tracking_ = false;
  int64_t mark_ = 0;
  std::vector<std::pair<int64_t, int64_t>> removed_;  // (key, version)
  std::vector<uint32_t> dirty_;
};

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_CHANGE_LOG_H_

