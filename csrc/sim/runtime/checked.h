// Checked mode's copies of a dispatch's buffers, each ending at a guard page.
//
// A buffer's end sits exactly on an inaccessible page when its size allows
// the alignment the kernel may rely on (up to 16 bytes, never more than the
// original pointer had); any access past it faults and is reported with the
// buffer, offset, thread and line. The few bytes of slack that alignment
// leaves after the end, and the bytes before the start in the same page, hold
// a canary checked after the run, so writes there are caught too (reads
// there are not).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "runtime.h"

namespace mtlsim {

class GuardedBuffers {
 public:
  explicit GuardedBuffers(const Launch& launch);
  ~GuardedBuffers();
  GuardedBuffers(const GuardedBuffers&) = delete;
  GuardedBuffers& operator=(const GuardedBuffers&) = delete;

  void* data(uint32_t slot) const { return slots_[slot].data; }
  // Copies the caller's buffers in and re-arms the canaries.
  void load(const Launch& launch);
  // Copies results back to the caller's buffers.
  void store(const Launch& launch) const;
  // The bytes of every bound slot, for comparing schedules.
  std::vector<std::vector<unsigned char>> contents() const;
  // A description of damaged canaries, or "".
  std::string check_canaries() const;
  // What a faulting address hit, or "" if it is not next to a buffer.
  std::string describe(const void* addr, const char* access) const;

 private:
  struct Slot {
    char* mapping = nullptr;
    size_t mapping_bytes = 0;
    char* data = nullptr;
    size_t size = 0;
    char* page_start = nullptr;  // first accessible byte
    char* page_end = nullptr;    // first guard byte after the data
  };
  std::array<Slot, kMaxBufferSlots> slots_{};
};

}  // namespace mtlsim
