// Tests of native/change_log.h: nothing is noted before Start; removals
// carry their version; a row is listed when its version first rises above
// the mark; a save forgets what it holds.
#include <cstdint>
#include <map>
#include <vector>

#include "native/change_log.h"
#include "native/test_check.h"

using graphmod::ChangeLog;

namespace {

void TestSilentUntilStarted() {
  ChangeLog log;
  log.NoteRemoved(1, 5);
  log.NoteChanged(3, 0, true);
  CHECK(!log.tracking() && log.removed().empty() && log.DirtyRows().empty());
}

void TestNotesAfterStart() {
  ChangeLog log;
  log.Start(10);
  CHECK(log.tracking() && log.mark() == 10);
  log.NoteRemoved(7, 11);
  CHECK(log.removed().size() == 1 && log.removed()[0] == std::make_pair(int64_t{7}, int64_t{11}));
  log.NoteChanged(1, 10, false);  // at the mark: its first change since
  log.NoteChanged(2, 11, false);  // already above the mark: listed before
  log.NoteChanged(3, 50, true);   // a new row, whatever its stale version
  log.NoteChanged(1, 10, false);  // listed twice, read once
  CHECK(log.DirtyRows() == (std::vector<uint32_t>{1, 3}));
}

void TestForgetWhatASaveHolds() {
  ChangeLog log;
  log.Start(0);
  for (int64_t v = 1; v <= 6; ++v) log.NoteRemoved(100 + v, v);
  std::map<uint32_t, uint32_t> version = {{1, 2}, {2, 5}, {3, 7}};
  for (const auto& [row, v] : version) log.NoteChanged(row, 0, false);
  // A save at version 5 holds removals before 5 and rows at versions <= 5.
  log.Forget(5, [&](uint32_t row) { return version[row]; });
  CHECK(log.mark() == 5);
  CHECK(log.removed().size() == 2 && log.removed()[0].first == 105);
  CHECK(log.DirtyRows() == (std::vector<uint32_t>{3}));
  // An older `since` keeps the mark and the rows.
  log.Forget(3, [&](uint32_t row) { return version[row]; });
  CHECK(log.mark() == 5 && log.DirtyRows().size() == 1);
  log.ClearDirty();
  CHECK(log.DirtyRows().empty() && log.removed().size() == 2);
}

// Trim keeps the list near the rows in memory: it drops the rows at or
// below the mark (freed ones: version 0) and duplicates, never a row a
// delta needs, and only once the list outgrows 2 * live_rows + 4096.
void TestTrim() {
  ChangeLog log;
  log.Start(10);
  std::map<uint32_t, uint32_t> version;
  for (uint32_t row = 0; row < 6000; ++row) {
    version[row] = row % 3 == 0 ? 0 : 11;  // a third spilled (version 0)
    log.NoteChanged(row, 0, true);
    if (row % 5 == 0) log.NoteChanged(row, 0, true);  // listed twice
  }
  auto version_of = [&](uint32_t row) { return version[row]; };
  log.Trim(1000, version_of);  // 7200 entries <= 2 * 1000 + 4096? no: trimmed
  const std::vector<uint32_t> rows = log.DirtyRows();
  CHECK(rows.size() == 4000);
  for (uint32_t row : rows) CHECK(version[row] == 11);
  log.NoteChanged(1, 0, true);
  log.Trim(1000, version_of);  // 4001 entries: under the bound, kept as they are
  CHECK(log.DirtyRows().size() == 4000);
}

}  // namespace

int main() {
  TestSilentUntilStarted();
  TestNotesAfterStart();
  TestForgetWhatASaveHolds();
  TestTrim();
  return graphmod_test::TestExit("change_log_test");
}
