#include "native/table.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <string>
#include <vector>

#include "native/indexed_arena.h"
#include "native/log_tier.h"
#include "native/row_buckets.h"
#include "native/sharded_table.h"

namespace graphmod {

std::string ValidateConfig(const TableConfig& c) {
  if (c.dim <= 0) return "dim must be positive, got " + std::to_string(c.dim);
  if (c.dim > (1 << 20)) return "dim must be at most 1048576, got " + std::to_string(c.dim);
  if (c.num_slots < 0 || c.num_slots > 16)
    return "num_slots must be in [0, 16], got " + std::to_string(c.num_slots);
  if (static_cast<int>(c.slot_init.size()) != c.num_slots)
    return "slot_init has " + std::to_string(c.slot_init.size()) + " values for " +
           std::to_string(c.num_slots) + " slots";
  if (c.num_shards < 1 || c.num_shards > 4096 || (c.num_shards & (c.num_shards - 1)) != 0)
    return "num_shards must be a power of two in [1, 4096], got " + std::to_string(c.num_shards);
  if (c.sketch_width < 0 || c.sketch_width > (int64_t{1} << 32))
    return "sketch_width must be 0 (exact counting) or in [1, 2^32], got " +
           std::to_string(c.sketch_width);
  if (c.layout != "arena" && c.layout != "buckets")
    return "layout must be 'buckets' or 'arena', got '" + c.layout + "'";
  if (!(c.memory_budget >= 0))
    return "memory_budget must be 0 (no disk tier), a fraction of rows in (0, 1] or bytes "
           "above 1, got " + std::to_string(c.memory_budget);
  if (c.memory_budget > 0 && c.storage_path.empty())
    return "memory_budget needs a storage_path (a local directory for the rows beyond it)";
  if (c.memory_budget == 0 && !c.storage_path.empty())
    return "storage_path '" + c.storage_path + "' needs a memory_budget (what stays in memory)";
  if (c.max_rows < -1 || c.max_rows == 0)
    return "max_rows must be positive or -1 (no bound), got " + std::to_string(c.max_rows);
  if (c.init == Initializer::kUniform && !(c.init_a < c.init_b))
    return "uniform initializer needs low < high, got [" + std::to_string(c.init_a) + ", " +
           std::to_string(c.init_b) + ")";
  if ((c.init == Initializer::kNormal || c.init == Initializer::kTruncatedNormal) &&
      !(c.init_b >= 0.f))
    return "normal initializer needs stddev >= 0, got " + std::to_string(c.init_b);
  return "";
}

void InitialRow(const TableConfig& config, int64_t key, float* out) {
  InitialValues({config.init, config.init_a, config.init_b, config.seed}, key, out, config.dim);
}

void MissingRow(const TableConfig& config, int64_t key, float* out) {
  if (config.missing_is_initializer) {
    InitialRow(config, key, out);
  } else {
    std::fill(out, out + config.dim, config.default_value);
  }
}

namespace {

// The one place that picks a shard layout for a table (ValidateConfig has
// checked the name).
std::unique_ptr<TableImpl> MakeTableImpl(const TableConfig& config) {
  if (config.layout == "buckets") return std::make_unique<ShardedTable<RowBuckets>>(config);
  return std::make_unique<ShardedTable<IndexedArena>>(config);
}

// A fresh directory for one table's tier under storage_path: the table's
// name (made a file name) and, since a process may hold several tables of
// one name (training and evaluation graphs) and processes may share the
// path, the process id and a serial number.
std::string TierDirectory(const TableConfig& config) {
  static std::atomic<int64_t> serial{0};
  std::string name = config.name;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return config.storage_path + "/" + name + "." + std::to_string(getpid()) + "." +
         std::to_string(serial++);
}

// Removes what killed processes left under storage_path: table directories
// (name.pid.serial) whose shard directories no live tier holds (the tiers'
// flocks went with their processes, in any pid namespace).
void RemoveOrphanTiers(const std::string& storage_path) {
  DIR* d = opendir(storage_path.c_str());
  if (d == nullptr) return;
  std::vector<std::string> tables;
  while (const dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    const size_t serial = name.rfind('.');
    const size_t pid = serial == std::string::npos || serial == 0
                           ? std::string::npos : name.rfind('.', serial - 1);
    auto digits = [&](size_t b, size_t e) {
      return e > b && std::all_of(name.begin() + b, name.begin() + e,
                                  [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    };
    if (pid != std::string::npos && pid > 0 && digits(pid + 1, serial) &&
        digits(serial + 1, name.size()))
      tables.push_back(storage_path + "/" + name);
  }
  closedir(d);
  for (const std::string& table : tables) {
    DIR* t = opendir(table.c_str());
    if (t == nullptr) continue;
    std::vector<std::string> shards;
    while (const dirent* entry = readdir(t))
      if (std::string(entry->d_name).rfind("shard-", 0) == 0)
        shards.push_back(table + "/" + entry->d_name);
    closedir(t);
    bool all_gone = true;
    for (const std::string& shard : shards) all_gone &= LogTier::RemoveIfUnused(shard);
    if (all_gone) rmdir(table.c_str());
  }
}

}  // namespace

EmbeddingTable::EmbeddingTable(TableConfig config)
    : config_(std::move(config)), impl_(MakeTableImpl(config_)) {
  if (config_.memory_budget <= 0) return;
  RemoveOrphanTiers(config_.storage_path);
  tier_dir_ = TierDirectory(config_);
  open_error_ = impl_->OpenTiers(tier_dir_);
}

EmbeddingTable::~EmbeddingTable() {
  impl_.reset();  // the tiers remove their files and directories
  if (!tier_dir_.empty()) rmdir(tier_dir_.c_str());
}

int64_t EmbeddingTable::size() const { return impl_->size(); }
int64_t EmbeddingTable::memory_bytes() const { return impl_->memory_bytes(); }
int64_t EmbeddingTable::version() const { return impl_->version(); }
TableCounters EmbeddingTable::counters() const { return impl_->counters(); }

std::string EmbeddingTable::FindOrInsert(const int64_t* keys, int64_t n, int64_t now,
                                         int64_t access_threshold, float* values,
                                         int64_t* handles, const Runner& run) {
  return impl_->FindOrInsert(keys, n, now, access_threshold, values, handles, run);
}

std::string EmbeddingTable::Find(const int64_t* keys, int64_t n, float* values,
                                 const Runner& run) const {
  return impl_->Find(keys, n, values, run);
}

std::string EmbeddingTable::Apply(const Optimizer& opt, const int64_t* ids,
                                  bool ids_are_handles, const float* grads, int64_t n,
                                  const Runner& run) {
  return impl_->Apply(opt, ids, ids_are_handles, grads, n, run);
}

std::string EmbeddingTable::CheckApply(const Optimizer& opt, const int64_t* ids,
                                       bool ids_are_handles, int64_t n) const {
  return impl_->CheckApply(opt, ids, ids_are_handles, n);
}

int64_t EmbeddingTable::Remove(const int64_t* keys, int64_t n) { return impl_->Remove(keys, n); }
int64_t EmbeddingTable::Evict(int64_t before) { return impl_->Evict(before); }
void EmbeddingTable::Clear() { impl_->Clear(); }

std::string EmbeddingTable::Export(int64_t min_version,
                                   const std::function<ExportBuffers(int64_t n)>& alloc,
                                   int shard) const {
  return impl_->Export(min_version, alloc, shard);
}

int64_t EmbeddingTable::CountRows(int64_t min_version, int shard) const {
  return impl_->CountRows(min_version, shard);
}

std::string EmbeddingTable::Import(const int64_t* keys, const float* values, const float* slots,
                                   const int64_t* counts, const int64_t* last_seen,
                                   const int64_t* versions, int64_t n, bool replace,
                                   const Runner& run) {
  return impl_->Import(keys, values, slots, counts, last_seen, versions, n, replace, run);
}

void EmbeddingTable::ExportPending(
    int64_t min_version, const std::function<PendingBuffers(int64_t n, int64_t sketch)>& alloc,
    int shard) const {
  impl_->ExportPending(min_version, alloc, shard);
}

int64_t EmbeddingTable::CountPending(int64_t min_version, int shard) const {
  return impl_->CountPending(min_version, shard);
}

int64_t EmbeddingTable::TrackRemovals() { return impl_->TrackRemovals(); }

void EmbeddingTable::ExportRemoved(int64_t since,
                                   const std::function<int64_t*(int64_t n)>& alloc) {
  impl_->ExportRemoved(since, alloc);
}

std::string EmbeddingTable::ImportPending(const int64_t* keys, const int64_t* counts,
                                          const int64_t* last_seen, int64_t n,
                                          const int32_t* sketch, int64_t sketch_count) {
  return impl_->ImportPending(keys, counts, last_seen, n, sketch, sketch_count);
}

int64_t EmbeddingTable::sketch_size() const { return impl_->sketch_size(); }

}  // namespace graphmod
