// CRC-32C (Castagnoli), the checksum of every record and segment header the
// disk tier writes (native/segment_file.h).
#ifndef GRAPHMOD_NATIVE_CRC32C_H_
#define GRAPHMOD_NATIVE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace graphmod {

// Uses the CPU's crc32 instruction when it has SSE4.2 (checked at run time),
// else a table-driven software loop; both give the same value.
uint32_t Crc32c(const void* data, size_t n);
uint32_t Crc32cSoftware(const void* data, size_t n);  // the fallback, for tests

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_CRC32C_H_
