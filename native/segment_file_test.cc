// Tests of native/segment_file.h: the header written and read back, and
// rejected when damaged (every byte, and each field with a valid crc); a
// record framed, written, read back; a flipped byte caught by its crc32c;
// short reads and failed calls reported as errors; naming and listing;
// CreateSegmentFile and MakeDirs, and their errors. Files go under a fresh
// mkdtemp directory, removed at the end.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "native/crc32c.h"
#include "native/segment_file.h"
#include "native/test_check.h"
#include "native/test_dir.h"

using graphmod::SegmentHeader;

namespace {

std::string g_base;  // this run's scratch directory

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

SegmentHeader Header(uint32_t record_bytes, uint32_t number) {
  SegmentHeader h;
  h.record_bytes = record_bytes;
  h.stride = static_cast<uint32_t>(graphmod::DiskStride(record_bytes));
  h.number = number;
  return h;
}

bool SameHeader(const SegmentHeader& a, const SegmentHeader& b) {
  return a.version == b.version && a.record_bytes == b.record_bytes && a.stride == b.stride &&
         a.number == b.number;
}

uint32_t U32At(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void PutU32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }

// A header edited field by field gets its crc recomputed, so only the field
// check can catch the edit.
void Reseal(char* header) { PutU32(header + 24, graphmod::Crc32c(header, 24)); }

// ------------------------------------------------------------------ tests

void TestHeaderRoundTrip() {
  const SegmentHeader h = Header(88, 3);
  CHECK(h.version == 1 && h.stride == 96);
  char bytes[graphmod::kSegmentHeaderBytes];
  std::memset(bytes, 0x5A, sizeof(bytes));
  graphmod::EncodeSegmentHeader(h, bytes);
  // The documented layout, byte for byte.
  CHECK(std::memcmp(bytes, "GMSEG1\0\0", 8) == 0);
  CHECK(U32At(bytes + 8) == 1 && U32At(bytes + 12) == 88 && U32At(bytes + 16) == 96 &&
        U32At(bytes + 20) == 3 && U32At(bytes + 24) == graphmod::Crc32c(bytes, 24));
  for (size_t i = 28; i < graphmod::kSegmentHeaderBytes; ++i) CHECK(bytes[i] == 0);
  SegmentHeader back;
  CHECK(graphmod::DecodeSegmentHeader(bytes, &back).empty() && SameHeader(back, h));

  // Through a file: CreateSegmentFile writes exactly the header.
  const std::string path = g_base + "/" + graphmod::SegmentFileName(7);
  int fd = -1;
  CHECK(graphmod::CreateSegmentFile(path, Header(24, 7), &fd).empty() && fd >= 0);
  struct stat st;
  CHECK(fstat(fd, &st) == 0 && st.st_size == 64);
  char read_back[graphmod::kSegmentHeaderBytes];
  CHECK(graphmod::PreadAll(fd, read_back, sizeof(read_back), 0) == 0);
  CHECK(graphmod::DecodeSegmentHeader(read_back, &back).empty() &&
        SameHeader(back, Header(24, 7)));
  close(fd);
  // Created again: truncated to a fresh header.
  CHECK(graphmod::CreateSegmentFile(path, Header(32, 8), &fd).empty());
  CHECK(fstat(fd, &st) == 0 && st.st_size == 64);
  CHECK(graphmod::PreadAll(fd, read_back, sizeof(read_back), 0) == 0);
  CHECK(graphmod::DecodeSegmentHeader(read_back, &back).empty() &&
        SameHeader(back, Header(32, 8)));
  close(fd);
  unlink(path.c_str());
}

void TestDamagedHeaderRejected() {
  const SegmentHeader h = Header(88, 3);
  char good[graphmod::kSegmentHeaderBytes];
  graphmod::EncodeSegmentHeader(h, good);
  const SegmentHeader sentinel = Header(8, 99);
  // Any flipped bit: the magic and the fields are under the crc, the crc is
  // itself compared, the rest must be zero. *h is left alone.
  for (size_t i = 0; i < graphmod::kSegmentHeaderBytes; ++i) {
    for (int bit = 0; bit < 8; bit += 7) {
      char bad[graphmod::kSegmentHeaderBytes];
      std::memcpy(bad, good, sizeof(bad));
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      SegmentHeader out = sentinel;
      CHECK(!graphmod::DecodeSegmentHeader(bad, &out).empty());
      CHECK(SameHeader(out, sentinel));
    }
  }
  auto decode = [&](void (*edit)(char*)) {
    char bad[graphmod::kSegmentHeaderBytes];
    std::memcpy(bad, good, sizeof(bad));
    edit(bad);
    SegmentHeader out = sentinel;
    const std::string e = graphmod::DecodeSegmentHeader(bad, &out);
    if (!e.empty()) CHECK(SameHeader(out, sentinel));
    return e;
  };
  // Each field, with a valid crc.
  CHECK(Contains(decode([](char* b) {
                   b[5] = '2';  // GMSEG2
                   Reseal(b);
                 }),
                 "magic"));
  CHECK(Contains(decode([](char* b) { b[0] = 0; }), "magic"));  // magic first, before the crc
  CHECK(Contains(decode([](char* b) { b[3] ^= 1; }), "magic"));
  CHECK(Contains(decode([](char* b) { b[9] ^= 1; }), "crc32c"));
  CHECK(Contains(decode([](char* b) {
                   PutU32(b + 8, 2);  // version
                   Reseal(b);
                 }),
                 "format version 2, not 1"));
  CHECK(Contains(decode([](char* b) {
                   PutU32(b + 12, 96);  // record_bytes alone: the stride no longer fits
                   Reseal(b);
                 }),
                 "record_bytes 96 and stride 96"));
  CHECK(Contains(decode([](char* b) {
                   PutU32(b + 16, 100);  // stride alone
                   Reseal(b);
                 }),
                 "stride 100"));
  CHECK(Contains(decode([](char* b) {
                   PutU32(b + 12, 20);  // not a multiple of 8, stride consistent
                   PutU32(b + 16, 28);
                   Reseal(b);
                 }),
                 "record_bytes 20"));
  CHECK(Contains(decode([](char* b) {
                   PutU32(b + 12, 0);
                   PutU32(b + 16, 8);
                   Reseal(b);
                 }),
                 "record_bytes 0"));
  CHECK(Contains(decode([](char* b) {
                   PutU32(b + 24, U32At(b + 24) + 1);  // the crc
                 }),
                 "crc32c"));
  CHECK(Contains(decode([](char* b) { b[40] = 1; }), "header byte 40 is not zero"));
  CHECK(Contains(decode([](char* b) { b[63] = 1; }), "header byte 63 is not zero"));
  // A consistent header of another shape or segment decodes: record_bytes and
  // number are the caller's to compare.
  char other[graphmod::kSegmentHeaderBytes];
  graphmod::EncodeSegmentHeader(Header(128, 4), other);
  SegmentHeader out;
  CHECK(graphmod::DecodeSegmentHeader(other, &out).empty() && out.record_bytes == 128 &&
        out.number == 4 && !SameHeader(out, h));
}

void TestRecordFraming() {
  const size_t rb = 88, stride = graphmod::DiskStride(rb);
  CHECK(stride == 96);
  CHECK(graphmod::RecordOffset(stride, 0) == 64 && graphmod::RecordOffset(stride, 10) == 64 + 960);
  CHECK(graphmod::RecordOffset(stride, 0xFFFFFFFEu) == 64 + uint64_t{0xFFFFFFFEu} * 96);
  std::mt19937_64 rng(5);
  std::vector<char> rec(rb);
  for (char& c : rec) c = static_cast<char>(rng());
  std::vector<char> disk(stride, static_cast<char>(0xAB));  // the pad is written, not assumed
  graphmod::FrameRecord(rec.data(), rb, disk.data());
  CHECK(std::memcmp(disk.data(), rec.data(), rb) == 0);
  CHECK(U32At(disk.data() + rb) == graphmod::Crc32c(rec.data(), rb));
  CHECK(U32At(disk.data() + rb + 4) == 0);
  CHECK(graphmod::RecordIntact(disk.data(), rb));

  // Written at its place in a segment file and read back.
  const std::string path = g_base + "/" + graphmod::SegmentFileName(1);
  int fd = -1;
  CHECK(graphmod::CreateSegmentFile(path, Header(rb, 1), &fd).empty());
  std::vector<char> three(3 * stride);
  for (size_t i = 0; i < 3; ++i) {
    rec[0] = static_cast<char>(i);
    graphmod::FrameRecord(rec.data(), rb, three.data() + i * stride);
  }
  CHECK(graphmod::PwriteAll(fd, three.data(), three.size(), graphmod::RecordOffset(stride, 0)) ==
        0);
  std::vector<char> back(stride);
  CHECK(graphmod::PreadAll(fd, back.data(), stride, graphmod::RecordOffset(stride, 2)) == 0);
  CHECK(graphmod::RecordIntact(back.data(), rb) && back[0] == 2);
  CHECK(std::memcmp(back.data(), three.data() + 2 * stride, stride) == 0);
  graphmod::DropCache(fd, graphmod::RecordOffset(stride, 1), stride);  // advice: no effect on data
  graphmod::DropCache(fd, 0, 0);
  CHECK(graphmod::PreadAll(fd, back.data(), stride, graphmod::RecordOffset(stride, 1)) == 0);
  CHECK(std::memcmp(back.data(), three.data() + stride, stride) == 0);
  close(fd);
  unlink(path.c_str());
}

void TestFlippedByteDetected() {
  for (size_t rb : {size_t{24}, size_t{88}, size_t{1024}}) {
    std::mt19937_64 rng(rb);
    std::vector<char> rec(rb);
    for (char& c : rec) c = static_cast<char>(rng());
    std::vector<char> disk(graphmod::DiskStride(rb));
    graphmod::FrameRecord(rec.data(), rb, disk.data());
    CHECK(graphmod::RecordIntact(disk.data(), rb));
    // Every bit of the record and of its crc.
    for (size_t i = 0; i < rb + 4; ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        disk[i] = static_cast<char>(disk[i] ^ (1 << bit));
        CHECK(!graphmod::RecordIntact(disk.data(), rb));
        disk[i] = static_cast<char>(disk[i] ^ (1 << bit));
      }
    }
    CHECK(graphmod::RecordIntact(disk.data(), rb));
  }
}

void TestShortReadsAndFailures() {
  const std::string path = g_base + "/short";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0);
  std::vector<char> data(64 + 96, 7);
  CHECK(graphmod::PwriteAll(fd, data.data(), data.size(), 0) == 0);
  std::vector<char> buf(96);
  CHECK(graphmod::PreadAll(fd, buf.data(), 96, 64) == 0);   // exactly to the end
  CHECK(graphmod::PreadAll(fd, buf.data(), 96, 112) == -1);  // half a record, then the end
  CHECK(graphmod::PreadAll(fd, buf.data(), 96, 160) == -1);  // at the end
  CHECK(graphmod::PreadAll(fd, buf.data(), 96, 4096) == -1);  // past it
  CHECK(graphmod::ErrnoText(-1) == "the file ends early");
  close(fd);
  // The system's reasons, as errno and as text.
  CHECK(graphmod::PreadAll(-1, buf.data(), 96, 0) == EBADF);
  CHECK(graphmod::PwriteAll(-1, buf.data(), 96, 0) == EBADF);
  CHECK(graphmod::ErrnoText(EBADF) == std::strerror(EBADF));
  CHECK(graphmod::ErrnoText(ENOSPC) == std::strerror(ENOSPC));
  const int ro = open(path.c_str(), O_RDONLY);
  CHECK(graphmod::PwriteAll(ro, buf.data(), 96, 0) == EBADF);
  close(ro);
  // Nothing to do is no error.
  CHECK(graphmod::PreadAll(-1, buf.data(), 0, 0) == 0);
  unlink(path.c_str());
  // CreateSegmentFile's errors name the file and the reason; *fd stays.
  int untouched = -7;
  const std::string missing = g_base + "/no/such/dir/seg-1.log";
  CHECK(graphmod::CreateSegmentFile(missing, Header(24, 1), &untouched) ==
        "cannot create '" + missing + "': " + std::strerror(ENOENT));
  CHECK(untouched == -7);
}

void TestNaming() {
  for (uint32_t n : {0u, 1u, 9u, 10u, 12u, 1000000u, 0xFFFFFFFEu, 0xFFFFFFFFu}) {
    const std::string name = graphmod::SegmentFileName(n);
    CHECK(name == "seg-" + std::to_string(n) + ".log");
    CHECK(graphmod::IsSegmentName(name.c_str()));
    uint32_t back = n + 1;
    CHECK(graphmod::ParseSegmentName(name.c_str(), &back) && back == n);
  }
  for (const char* bad : {"", "seg-", "seg-.log", "seg-x.log", "seg-1a.log", "seg-1.log.tmp",
                          "xseg-1.log", "seg-1.lo", "seg1.log", "seg--1.log", "seg-+1.log",
                          "SEG-1.log", "seg- 1.log"}) {
    uint32_t n = 5;
    CHECK(!graphmod::IsSegmentName(bad));
    CHECK(!graphmod::ParseSegmentName(bad, &n) && n == 5);
  }
  // Open wipes any seg-<digits>.log, even one whose number no tier would give.
  uint32_t n = 5;
  CHECK(graphmod::IsSegmentName("seg-4294967296.log") &&
        !graphmod::ParseSegmentName("seg-4294967296.log", &n) && n == 5);
  CHECK(graphmod::IsSegmentName("seg-00000000000000000001.log") &&
        !graphmod::ParseSegmentName("seg-00000000000000000001.log", &n));
  CHECK(graphmod::ParseSegmentName("seg-007.log", &n) && n == 7);

  // Listing: segment names only; the directory's descriptor stays open.
  const std::string dir = g_base + "/list";
  CHECK(graphmod::MakeDirs(dir).empty());
  for (const char* name : {"seg-1.log", "seg-12.log", "seg-x.log", "notes.txt"}) {
    const int fd = open((dir + "/" + name).c_str(), O_WRONLY | O_CREAT, 0644);
    CHECK(fd >= 0);
    close(fd);
  }
  CHECK(mkdir((dir + "/seg-3.log").c_str(), 0755) == 0);  // listed too: Open's unlink reports it
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  std::vector<std::string> names{"kept"};
  CHECK(graphmod::ListSegmentFiles(dir_fd, &names) == 0);
  std::sort(names.begin(), names.end());
  CHECK(names == (std::vector<std::string>{"kept", "seg-1.log", "seg-12.log", "seg-3.log"}));
  CHECK(fcntl(dir_fd, F_GETFD) != -1);
  names.clear();
  CHECK(graphmod::ListSegmentFiles(dir_fd, &names) == 0 && names.size() == 3);  // listed again
  close(dir_fd);
  const int file_fd = open((dir + "/notes.txt").c_str(), O_RDONLY);
  names.clear();
  CHECK(graphmod::ListSegmentFiles(file_fd, &names) == ENOTDIR && names.empty());
  close(file_fd);
  CHECK(graphmod::ListSegmentFiles(-1, &names) == EBADF && names.empty());
}

void TestMakeDirs() {
  const std::string deep = g_base + "/a/b/c";
  CHECK(graphmod::MakeDirs(deep).empty());
  struct stat st;
  CHECK(stat(deep.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
  CHECK(graphmod::MakeDirs(deep).empty());  // already there
  CHECK(graphmod::MakeDirs(deep + "/").empty());
  const std::string file = g_base + "/a/file";
  const int fd = open(file.c_str(), O_WRONLY | O_CREAT, 0644);
  CHECK(fd >= 0);
  close(fd);
  CHECK(graphmod::MakeDirs(file + "/x/y") ==
        "cannot create directory '" + file + "/x': " + std::strerror(ENOTDIR));
}

}  // namespace

int main() {
  const graphmod_test::ScratchDir scratch("segment_file_test");
  g_base = scratch.path();
  TestHeaderRoundTrip();
  TestDamagedHeaderRejected();
  TestRecordFraming();
  TestFlippedByteDetected();
  TestShortReadsAndFailures();
  TestNaming();
  TestMakeDirs();
  return graphmod_test::TestExit("segment_file_test");
}
