// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011): a counter-based generator. Four 32-bit words from a 128-bit
// counter and a 64-bit key, with no state between calls, so a kernel draws
// the bits of element i from i itself: the same bits whatever the launch
// geometry, on the GPU and in the simulator alike.
#pragma once

#include <metal_stdlib>

namespace mps_ext {

// The multipliers and the key's increments (Weyl sequence) of the reference
// implementation, Random123's philox4x32: what its known-answer vectors test.
constant constexpr uint kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constant constexpr uint kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

inline uint4 philox_round(uint4 c, uint2 k) {
  const uint hi0 = metal::mulhi(kPhiloxM0, c.x), lo0 = kPhiloxM0 * c.x;
  const uint hi1 = metal::mulhi(kPhiloxM1, c.z), lo1 = kPhiloxM1 * c.z;
  return uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
}

// Ten rounds, the key bumped between each two.
inline uint4 philox4x32_10(uint4 counter, uint2 key) {
  for (uint r = 0; r < 9; ++r) {
    counter = philox_round(counter, key);
    key += uint2(kPhiloxW0, kPhiloxW1);
  }
  return philox_round(counter, key);
}

}  // namespace mps_ext
