#include "checked.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <sstream>

#include "fiber.h"

namespace mtlsim {

namespace {

constexpr unsigned char kCanary = 0xA5;

size_t natural_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  size_t align = 16;
  while (align > 1 && a % align) align /= 2;
  return align;
}

}  // namespace

GuardedBuffers::GuardedBuffers(const Launch& launch) {
  const size_t page = page_size();
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    const Buffer& b = launch.buffers[i];
    if (!b.data) continue;
    Slot& s = slots_[i];
    const size_t data_pages = (b.size + page - 1) / page;
    // [guard][data pages][guard]
    s.mapping_bytes = (data_pages + 2) * page;
    void* m = mmap(nullptr, s.mapping_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANON, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    s.mapping = static_cast<char*>(m);
    s.page_start = s.mapping + page;
    s.page_end = s.page_start + data_pages * page;
    if (data_pages) mprotect(s.page_start, data_pages * page, PROT_READ | PROT_WRITE);
    const size_t align = natural_alignment(b.data);
    s.size = b.size;
    s.data = s.page_end - b.size;
    s.data -= reinterpret_cast<uintptr_t>(s.data) % align;
    if (s.data < s.page_start) s.data = s.page_start;  // only for size 0 in an empty mapping
  }
}

GuardedBuffers::~GuardedBuffers() {
  for (Slot& s : slots_)
    if (s.mapping) munmap(s.mapping, s.mapping_bytes);
}

void GuardedBuffers::load(const Launch& launch) {
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    Slot& s = slots_[i];
    if (!s.mapping) continue;
    std::memset(s.page_start, kCanary, size_t(s.data - s.page_start));
    if (s.size) std::memcpy(s.data, launch.buffers[i].data, s.size);
    std::memset(s.data + s.size, kCanary, size_t(s.page_end - (s.data + s.size)));
  }
}

void GuardedBuffers::store(const Launch& launch) const {
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i)
    if (slots_[i].mapping && slots_[i].size) std::memcpy(launch.buffers[i].data, slots_[i].data, slots_[i].size);
}

std::vector<std::vector<unsigned char>> GuardedBuffers::contents() const {
  std::vector<std::vector<unsigned char>> out(kMaxBufferSlots);
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i)
    if (slots_[i].mapping) out[i].assign(slots_[i].data, slots_[i].data + slots_[i].size);
  return out;
}

std::string GuardedBuffers::check_canaries() const {
  std::ostringstream report;
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    const Slot& s = slots_[i];
    if (!s.mapping) continue;
    for (const char* p = s.page_start; p < s.page_end; ++p) {
      if (p == s.data) p += s.size;
      if (p >= s.page_end) break;
      if (static_cast<unsigned char>(*p) != kCanary) {
        report << "out-of-bounds write to buffer(" << i << ") at byte offset " << (p - s.data) << " (the buffer holds "
               << s.size << " bytes); found after the run, so the writing thread is unknown";
        return report.str();
      }
    }
  }
  return "";
}

std::string GuardedBuffers::describe(const void* addr, const char* access) const {
  const char* a = static_cast<const char*>(addr);
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    const Slot& s = slots_[i];
    if (!s.mapping || a < s.mapping || a >= s.mapping + s.mapping_bytes) continue;
    const bool after = a >= s.page_end, before = a < s.page_start;
    if (!after && !before) return "";
    std::ostringstream m;
    m << "out-of-bounds " << access << " of buffer(" << i << ") at byte offset " << (a - s.data)
      << " (the buffer holds " << s.size << " bytes)";
    return m.str();
  }
  return "";
}

}  // namespace mtlsim
