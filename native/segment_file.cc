#include "native/segment_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "native/crc32c.h"

namespace graphmod {

namespace {

// strerror_r has a GNU (returns the text) and an XSI (fills buf) form.
inline const char* StrerrorResult(int, const char* buf) { return buf; }
inline const char* StrerrorResult(const char* text, const char*) { return text; }

uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

constexpr char kMagic[8] = {'G', 'M', 'S', 'E', 'G', '1', '\0', '\0'};
constexpr size_t kHeaderCrcAt = 24;  // the crc covers the 24 bytes before it

}  // namespace

// ---------------------------------------------------------------- header

void EncodeSegmentHeader(const SegmentHeader& h, char* out) {
  std::memset(out, 0, kSegmentHeaderBytes);
  std::memcpy(out, kMagic, 8);
  const uint32_t fields[4] = {h.version, h.record_bytes, h.stride, h.number};
  std::memcpy(out + 8, fields, sizeof(fields));
  const uint32_t crc = Crc32c(out, kHeaderCrcAt);
  std::memcpy(out + kHeaderCrcAt, &crc, 4);
}

std::string DecodeSegmentHeader(const char* in, SegmentHeader* h) {
  if (std::memcmp(in, kMagic, 8) != 0) return "not a segment file (no GMSEG1 magic)";
  if (Crc32c(in, kHeaderCrcAt) != LoadU32(in + kHeaderCrcAt)) return "header crc32c mismatch";
  SegmentHeader d;
  d.version = LoadU32(in + 8);
  d.record_bytes = LoadU32(in + 12);
  d.stride = LoadU32(in + 16);
  d.number = LoadU32(in + 20);
  if (d.version != kSegmentFormatVersion)
    return "format version " + std::to_string(d.version) + ", not " +
           std::to_string(kSegmentFormatVersion);
  if (d.record_bytes == 0 || d.record_bytes % 8 != 0 || d.stride != DiskStride(d.record_bytes))
    return "record_bytes " + std::to_string(d.record_bytes) + " and stride " +
           std::to_string(d.stride) + " do not fit";
  for (size_t i = kHeaderCrcAt + 4; i < kSegmentHeaderBytes; ++i)
    if (in[i] != 0) return "header byte " + std::to_string(i) + " is not zero";
  *h = d;
  return "";
}

std::string CreateSegmentFile(const std::string& path, const SegmentHeader& h, int* fd) {
  const int f = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f < 0) return "cannot create '" + path + "': " + ErrnoText(errno);
  char header[kSegmentHeaderBytes];
  EncodeSegmentHeader(h, header);
  const int err = PwriteAll(f, header, kSegmentHeaderBytes, 0);
  if (err != 0) {
    close(f);
    unlink(path.c_str());
    return "cannot write '" + path + "': " + ErrnoText(err);
  }
  *fd = f;
  return "";
}

// ---------------------------------------------------------------- records

void FrameRecord(const char* record, size_t record_bytes, char* disk) {
  std::memcpy(disk, record, record_bytes);
  const uint32_t crc = Crc32c(record, record_bytes);
  std::memcpy(disk + record_bytes, &crc, 4);
  std::memset(disk + record_bytes + 4, 0, 4);
}

bool RecordIntact(const char* disk, size_t record_bytes) {
  return Crc32c(disk, record_bytes) == LoadU32(disk + record_bytes);
}

// ---------------------------------------------------------------- naming

std::string SegmentFileName(uint32_t number) { return "seg-" + std::to_string(number) + ".log"; }

bool IsSegmentName(const char* name) {
  const size_t len = std::strlen(name);
  if (len < 9 || std::strncmp(name, "seg-", 4) != 0 || std::strcmp(name + len - 4, ".log") != 0)
    return false;
  for (size_t i = 4; i < len - 4; ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  return true;
}

bool ParseSegmentName(const char* name, uint32_t* number) {
  if (!IsSegmentName(name)) return false;
  const size_t digits = std::strlen(name) - 8;
  if (digits > 10) return false;
  const unsigned long long n = std::strtoull(name + 4, nullptr, 10);
  if (n > 0xFFFFFFFFull) return false;
  *number = static_cast<uint32_t>(n);
  return true;
}

int ListSegmentFiles(int dir_fd, std::vector<std::string>* names) {
  // A dup, so closedir leaves dir_fd open. The dup shares dir_fd's position:
  // rewound, a second listing sees every entry too.
  const int list_fd = dup(dir_fd);
  DIR* d = list_fd < 0 ? nullptr : fdopendir(list_fd);
  if (d == nullptr) {
    const int err = errno;
    if (list_fd >= 0) close(list_fd);
    return err;
  }
  rewinddir(d);
  while (const dirent* entry = readdir(d))
    if (IsSegmentName(entry->d_name)) names->emplace_back(entry->d_name);
  closedir(d);
  return 0;
}

// ---------------------------------------------------------------- I/O

std::string ErrnoText(int e) {
  if (e < 0) return "the file ends early";
  char buf[256] = "unknown error";
  return StrerrorResult(strerror_r(e, buf, sizeof(buf)), buf);
}

// 0, or the errno of the failure. Short writes (a signal, a nearly full disk)
// are continued; a write of 0 bytes is taken as a full disk.
int PwriteAll(int fd, const char* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t w = pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;
    p += w, n -= static_cast<size_t>(w), offset += static_cast<uint64_t>(w);
  }
  return 0;
}

// 0, the errno of the failure, or -1 when the file ends before n bytes.
int PreadAll(int fd, char* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t r = pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return -1;
    p += r, n -= static_cast<size_t>(r), offset += static_cast<uint64_t>(r);
  }
  return 0;
}

// Pages a sequential pass (export, compaction) read once are dropped from
// the page cache: nothing reads them again soon, and cached they would crowd
// out the pages of spills and batched reads. Those stay: rows spilled are
// read back soon under skewed ids (the least recently used of the hot set),
// a page holds ~40 records of dim 16, and the kernel reclaims the cache (it
// is not the process's resident memory) under pressure. Dropping written
// and read pages too cost 2-3x in examples/s on a 200k-key table 4x its
// budget (2026-11-27, C++ driver: 1.02-1.08 vs 1.66-1.71 M examples/s at
// Zipf 1.2; every cold row a disk read). The kernel drops only whole pages
// inside the range, so it is widened to pages. length 0: to the end of the
// file. Advice only; failures are harmless.
void DropCache(int fd, uint64_t begin, uint64_t length) {
  const uint64_t page = 4096;
  const uint64_t first = begin & ~(page - 1);
  const uint64_t span = length == 0 ? 0 : ((begin + length + page - 1) & ~(page - 1)) - first;
  posix_fadvise(fd, static_cast<off_t>(first), static_cast<off_t>(span), POSIX_FADV_DONTNEED);
}

// mkdir -p.
std::string MakeDirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      return "cannot create directory '" + prefix + "': " + ErrnoText(errno);
  }
  return "";
}

}  // namespace graphmod
