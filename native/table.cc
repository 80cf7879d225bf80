#include "native/table.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <random>
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
  // A full table evicts among rows near the new key's slot in memory, where
  // the hot rows are once the coldest went to disk: LRU would turn around.
  if (c.memory_budget > 0 && c.max_rows != -1)
    return "max_rows and a memory_budget together are not supported yet (a full table would "
           "evict among the rows in memory, the most recently used); bound the table by "
           "eviction_threshold instead";
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

// This machine's name, made a file name: containers sharing a storage_path
// have names of their own, and pids of their own namespaces.
const std::string& HostName() {
  static const std::string host = [] {
    char buf[256] = {0};
    std::string h = gethostname(buf, sizeof(buf) - 1) == 0 && buf[0] ? buf : "host";
    for (char& c : h)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
    return h;
  }();
  return host;
}

// A fresh directory for one table's tier under storage_path:
// <name>.<host>.<pid>.<token>-<serial>. The table's name is made a file
// name; host and pid say whose it is (RemoveOrphanTiers), a token drawn once
// per process keeps two processes apart even where both are equal, and the
// serial tells apart the tables of one name a process holds (training and
// evaluation graphs).
std::string TierDirectory(const TableConfig& config) {
  static std::atomic<int64_t> serial{0};
  static const std::string token = [] {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(std::random_device{}()) << 32 |
                      std::random_device{}());
    return std::string(hex);
  }();
  std::string name = config.name;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return config.storage_path + "/" + name + "." + HostName() + "." + std::to_string(getpid()) +
         "." + token + "-" + std::to_string(serial++);
}

// Removes what killed processes left under storage_path: table directories
// (TierDirectory's names) whose shard directories no tier holds (their
// flocks went with their process), and whose process is gone: on this
// host, a pid no process has; made on another host (a shared path), a
// directory unchanged for ten minutes (its process may be making it now).
void RemoveOrphanTiers(const std::string& storage_path) {
  DIR* d = opendir(storage_path.c_str());
  if (d == nullptr) return;
  std::vector<std::string> tables;
  while (const dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;  // ...<host>.<pid>.<token>-<serial>
    const size_t tail = name.rfind('.');
    const size_t pid_at = tail == std::string::npos || tail == 0
                              ? std::string::npos : name.rfind('.', tail - 1);
    const size_t host_at = pid_at == std::string::npos || pid_at == 0
                               ? std::string::npos : name.rfind('.', pid_at - 1);
    if (host_at == std::string::npos || name.find('-', tail) == std::string::npos) continue;
    const std::string pid = name.substr(pid_at + 1, tail - pid_at - 1);
    if (pid.empty() || !std::all_of(pid.begin(), pid.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        }))
      continue;
    const std::string path = storage_path + "/" + name;
    if (name.compare(host_at + 1, pid_at - host_at - 1, HostName()) == 0) {
      const pid_t owner = static_cast<pid_t>(std::strtol(pid.c_str(), nullptr, 10));
      if (owner == getpid() || kill(owner, 0) == 0 || errno == EPERM) continue;  // alive
    } else {
      struct stat st;
      if (stat(path.c_str(), &st) != 0 || time(nullptr) - st.st_mtime < 600) continue;
    }
    tables.push_back(path);
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

std::string EmbeddingTable::Prefetch(const int64_t* keys, int64_t n, const Runner& run) {
  return impl_->Prefetch(keys, n, run);
}

std::string EmbeddingTable::Apply(const Optimizer& opt, const int64_t* ids,
                                  bool ids_are_handles, const float* grads, int64_t n,
                                  const Runner& run) {
  return impl_->Apply(opt, ids, ids_are_handles, grads, n, run);
}

std::string EmbeddingTable::CheckApply(const Optimizer& opt, const int64_t* ids,
                                       bool ids_are_handles, int64_t n, const Runner& run) const {
  return impl_->CheckApply(opt, ids, ids_are_handles, n, run);
}

int64_t EmbeddingTable::Remove(const int64_t* keys, int64_t n) { return impl_->Remove(keys, n); }
int64_t EmbeddingTable::Evict(int64_t before, const Runner& run) {
  return impl_->Evict(before, run);
}
void EmbeddingTable::Clear() { impl_->Clear(); }

std::string EmbeddingTable::Export(int64_t min_version,
                                   const std::function<ExportBuffers(int64_t n)>& alloc,
                                   int shard) const {
  return impl_->Export(
      min_version, shard, std::numeric_limits<int64_t>::max(),
      [&](int64_t total, int64_t) { return alloc(total); },
      [](int64_t) { return std::string(); }, nullptr);
}

std::string EmbeddingTable::Snapshot(
    int64_t min_version, int64_t chunk_rows, const PendingAlloc& pending,
    const std::function<ExportBuffers(int64_t total, int64_t n)>& alloc,
    const std::function<std::string(int64_t n)>& emit) const {
  return impl_->Export(min_version, -1, chunk_rows, alloc, emit, &pending);
}

int64_t EmbeddingTable::CountRows(int64_t min_version, int shard) const {
  return impl_->CountRows(min_version, shard);
}

std::string EmbeddingTable::Import(const int64_t* keys, const void* values, const void* slots,
                                   const int64_t* counts, const int64_t* last_seen,
                                   const int64_t* versions, int64_t n, bool replace,
                                   const Runner& run) {
  return impl_->Import(keys, values, slots, counts, last_seen, versions, n, replace, run);
}

void EmbeddingTable::ExportPending(int64_t min_version, const PendingAlloc& alloc,
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
