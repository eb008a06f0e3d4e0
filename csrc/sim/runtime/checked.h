// The copies of a dispatch's buffers that kernels run on (in every mode),
// each ending at a guard page.
//
// A buffer's end sits exactly on an inaccessible page when its size allows
// the alignment the kernel may rely on (up to 16 bytes, never more than the
// original pointer had); any access past it faults and is reported with the
// buffer, offset, thread and line. The few bytes of slack that alignment
// leaves after the end, and the bytes before the start in the same page, hold
// a canary checked after the run, so writes there are caught too (reads
// there are not). Buffers that overlap in the caller's memory (the same
// tensor bound twice, views of one tensor) share one copy, so writes through
// one are seen through the others, as on the GPU.
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

  void* data(uint32_t slot) const;
  // Copies the caller's buffers in and re-arms the canaries.
  void load();
  // Copies the results back to the caller's buffers (only the pages that
  // changed: a buffer the kernel only read is not written).
  void store() const;
  // The bytes of every bound slot, for comparing schedules.
  std::vector<std::vector<unsigned char>> contents() const;
  // A description of damaged canaries, or "".
  std::string check_canaries() const;
  // What a faulting address hit, or "" if it is not next to a buffer.
  std::string describe(const void* addr, const char* access) const;

 private:
  // One guarded copy of a range of the caller's memory covering one or more slots.
  struct Region {
    const char* host = nullptr;
    size_t size = 0;
    char* mapping = nullptr;
    size_t mapping_bytes = 0;
    char* data = nullptr;
    char* page_start = nullptr;  // first accessible byte
    char* page_end = nullptr;    // first guard byte after the data
    std::vector<uint32_t> slots;
  };
  std::string slots_of(const Region& r) const;

  std::array<const char*, kMaxBufferSlots> host_{};
  std::array<size_t, kMaxBufferSlots> size_{};
  std::array<int, kMaxBufferSlots> region_of_{};
  std::vector<Region> regions_;
};

}  // namespace mtlsim
