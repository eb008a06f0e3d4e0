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
//
// A strided view is copied element run by element run, not as its whole
// span: pages of the span that hold none of its elements stay inaccessible
// (an access there is reported like one past the end), the bytes between
// elements in the pages that do hold some are canaries. The caller's memory
// gets back only the bytes the kernel changed, compared with a snapshot
// taken at the first load: what other threads write meanwhile, inside the
// span or inside the elements the kernel only read, stays.
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
  // Copies the caller's buffers in (from the snapshot after the first time)
  // and re-arms the canaries.
  void load();
  // Copies the bytes the kernel changed back to the caller's buffers.
  void store() const;
  // The element bytes of every bound slot, for comparing schedules.
  std::vector<std::vector<unsigned char>> contents() const;
  // The byte offset in `slot` of byte `index` of its contents().
  size_t offset_in(uint32_t slot, size_t index) const;
  // A description of damaged canaries, or "".
  std::string check_canaries() const;
  // What a faulting address hit, or "" if it is not next to a buffer.
  std::string describe(const void* addr, const char* access) const;

  // Bytes [offset, offset + length) of a buffer or region.
  struct Run {
    size_t offset = 0, length = 0;
    size_t end() const { return offset + length; }
  };

 private:
  // One guarded copy of a range of the caller's memory covering one or more slots.
  struct Region {
    const char* host = nullptr;
    size_t size = 0;
    char* mapping = nullptr;
    size_t mapping_bytes = 0;
    char* data = nullptr;
    char* page_start = nullptr;  // first byte of the first data page
    char* page_end = nullptr;    // first guard byte after the data
    std::vector<uint32_t> slots;
    std::vector<Run> runs;        // what is copied, from `data`; sorted, disjoint
    std::vector<Run> pages;       // the pages holding runs, from `page_start`, in bytes
    std::vector<Run> accessible;  // the pages mapped readable and writable, from `page_start`
    std::vector<char> snapshot;   // the caller's bytes of `runs` at the first load, back to back
  };
  std::string slots_of(const Region& r) const;
  void map(Region& r);
  // Calls fn(first, count) for every canary byte range of `r`.
  template <class Fn>
  static void for_each_gap(const Region& r, Fn fn);

  std::array<const char*, kMaxBufferSlots> host_{};
  std::array<size_t, kMaxBufferSlots> size_{};
  std::array<int, kMaxBufferSlots> region_of_{};
  std::array<std::vector<Run>, kMaxBufferSlots> runs_{};  // each slot's, from its own start
  std::vector<Region> regions_;
  bool loaded_ = false;
};

}  // namespace mtlsim
