// Tests of native/crc32c.h: check values, and the hardware and software
// paths agreeing at every length and alignment.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "native/crc32c.h"
#include "native/test_check.h"

namespace {

void TestCrc32c() {
  // Check values of CRC-32C (iSCSI, RFC 3720 B.4).
  const char* digits = "123456789";
  CHECK(graphmod::Crc32c(digits, 9) == 0xE3069283u);
  CHECK(graphmod::Crc32cSoftware(digits, 9) == 0xE3069283u);
  unsigned char zeros[32] = {}, ones[32], ascending[32];
  std::memset(ones, 0xFF, 32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<unsigned char>(i);
  for (auto crc : {graphmod::Crc32c, graphmod::Crc32cSoftware}) {
    CHECK(crc(zeros, 32) == 0x8A9136AAu);
    CHECK(crc(ones, 32) == 0x62A8AB43u);
    CHECK(crc(ascending, 32) == 0x46DD794Eu);
    CHECK(crc(zeros, 0) == 0);
  }
  // Both paths agree at every length and alignment.
  std::mt19937_64 rng(1);
  std::vector<unsigned char> buf(400);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t offset = 0; offset < 8; ++offset)
    for (size_t len = 0; len + offset <= buf.size(); len += 7)
      CHECK(graphmod::Crc32c(buf.data() + offset, len) ==
            graphmod::Crc32cSoftware(buf.data() + offset, len));
}

}  // namespace

int main() {
  TestCrc32c();
  return graphmod_test::TestExit("crc32c_test");
}
