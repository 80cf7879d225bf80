// A segment file of the disk tier (native/log_tier.h) on disk, and the
// low-level file I/O the tier does: the header's format, record framing,
// naming, whole preads/pwrites with the system's reasons as text, page cache
// advice, directory creation. Nothing here knows of keys, the index or locks.
//
// On disk (host byte order; the files never leave the machine):
//   header  64 B: "GMSEG1\0\0", u32 format version (1), u32 record_bytes,
//           u32 disk stride, u32 segment number, u32 crc32c of the 24 bytes
//           before it, zeros.
//   record  at 64 + index * stride, stride = record_bytes + 8:
//           [record_bytes as given to Put | u32 crc32c of them | 4 zero bytes]
// A segment file is named seg-<number>.log.
#ifndef GRAPHMOD_NATIVE_SEGMENT_FILE_H_
#define GRAPHMOD_NATIVE_SEGMENT_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace graphmod {

constexpr size_t kSegmentHeaderBytes = 64;
constexpr uint32_t kSegmentFormatVersion = 1;

// Bytes a record of record_bytes takes on disk: the record, its crc32c, 4 zero bytes.
constexpr size_t DiskStride(size_t record_bytes) { return record_bytes + 8; }
// Where the record at `index` starts in its segment file.
constexpr uint64_t RecordOffset(size_t stride, uint32_t index) {
  return kSegmentHeaderBytes + uint64_t{index} * stride;
}

// ---- header

struct SegmentHeader {
  uint32_t version = kSegmentFormatVersion;
  uint32_t record_bytes = 0;
  uint32_t stride = 0;  // DiskStride(record_bytes)
  uint32_t number = 0;
};

// Writes the 64 header bytes of h to out.
void EncodeSegmentHeader(const SegmentHeader& h, char* out);
// Reads 64 header bytes: "" and *h, or what is wrong with them (magic, crc,
// version, a stride that does not fit record_bytes, non-zero padding). The
// caller compares record_bytes and number with what it expects.
std::string DecodeSegmentHeader(const char* in, SegmentHeader* h);

// Creates (or truncates) the file at path and writes h's header to it: ""
// and *fd (O_RDWR, close-on-exec), or an error naming path and the system's
// reason (then no file is left and *fd is untouched).
std::string CreateSegmentFile(const std::string& path, const SegmentHeader& h, int* fd);

// ---- records

// Writes the disk form of record (record_bytes) to disk (DiskStride bytes):
// the record, its crc32c, 4 zero bytes.
void FrameRecord(const char* record, size_t record_bytes, char* disk);
// Whether a disk record read back holds the crc32c of its record_bytes.
bool RecordIntact(const char* disk, size_t record_bytes);

// ---- naming

std::string SegmentFileName(uint32_t number);  // seg-<number>.log
// Whether name is seg-<digits>.log (what Open wipes; any number of digits).
bool IsSegmentName(const char* name);
// The number of a segment file's name; false when name is no segment's, or
// its number does not fit 32 bits.
bool ParseSegmentName(const char* name, uint32_t* number);
// Appends the names of the segment files in the directory dir_fd to *names
// (in directory order): 0, or the errno of a failure to list it. dir_fd
// stays open.
int ListSegmentFiles(int dir_fd, std::vector<std::string>* names);

// ---- I/O

// The system's text for errno e; e < 0 (PreadAll's short read): "the file ends early".
std::string ErrnoText(int e);
// 0, or the errno of the failure. Short writes (a signal, a nearly full disk)
// are continued; a write of 0 bytes is taken as a full disk.
int PwriteAll(int fd, const char* p, size_t n, uint64_t offset);
// 0, the errno of the failure, or -1 when the file ends before n bytes.
int PreadAll(int fd, char* p, size_t n, uint64_t offset);
// Drops the pages of [begin, begin + length) (widened to whole pages; length
// 0: to the end of the file) from the page cache. Advice only; failures are
// harmless.
void DropCache(int fd, uint64_t begin, uint64_t length);
// mkdir -p: "" or "cannot create directory '<prefix>': <reason>".
std::string MakeDirs(const std::string& dir);

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_SEGMENT_FILE_H_
