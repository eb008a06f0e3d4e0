#include "checked.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <sstream>

#include "fiber.h"

namespace mtlsim {

namespace {

constexpr unsigned char kCanary = 0xA5;
constexpr size_t kTrailingGuard = size_t(64) << 20;

size_t natural_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  size_t align = 16;
  while (align > 1 && a % align) align /= 2;
  return align;
}

}  // namespace

GuardedBuffers::GuardedBuffers(const Launch& launch) {
  region_of_.fill(-1);
  std::vector<uint32_t> bound;
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    if (!launch.buffers[i].data) continue;
    host_[i] = static_cast<const char*>(launch.buffers[i].data);
    size_[i] = launch.buffers[i].size;
    bound.push_back(i);
  }
  // Slots whose ranges overlap (or start together) share a region.
  std::sort(bound.begin(), bound.end(), [&](uint32_t a, uint32_t b) { return host_[a] < host_[b]; });
  for (uint32_t i : bound) {
    if (!regions_.empty()) {
      Region& r = regions_.back();
      if (host_[i] < r.host + r.size || host_[i] == r.host) {
        r.size = std::max(r.size, size_t(host_[i] + size_[i] - r.host));
        r.slots.push_back(i);
        region_of_[i] = int(regions_.size() - 1);
        continue;
      }
    }
    regions_.push_back(Region{host_[i], size_[i], nullptr, 0, nullptr, nullptr, nullptr, {i}});
    region_of_[i] = int(regions_.size() - 1);
  }

  const size_t page = page_size();
  for (Region& r : regions_) {
    const size_t data_pages = (r.size + page - 1) / page;
    // [guard][data pages][guard]: a long guard after the data (address space
    // only) also catches indices far past the end.
    r.mapping_bytes = (data_pages + 1) * page + kTrailingGuard;
    void* m = mmap(nullptr, r.mapping_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANON | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED || (data_pages && mprotect(static_cast<char*>(m) + page, data_pages * page,
                                                   PROT_READ | PROT_WRITE) != 0)) {
      const std::string why = std::strerror(errno);
      if (m != MAP_FAILED) munmap(m, r.mapping_bytes);
      for (Region& done : regions_)
        if (done.mapping) munmap(done.mapping, done.mapping_bytes);
      throw SimError("cannot map a copy of " + slots_of(r) + " (" + std::to_string(r.size) + " bytes): " + why);
    }
    r.mapping = static_cast<char*>(m);
    r.page_start = r.mapping + page;
    r.page_end = r.page_start + data_pages * page;
    r.data = r.page_end - r.size;
    r.data -= reinterpret_cast<uintptr_t>(r.data) % natural_alignment(r.host);
  }
}

GuardedBuffers::~GuardedBuffers() {
  for (Region& r : regions_) munmap(r.mapping, r.mapping_bytes);
}

void* GuardedBuffers::data(uint32_t slot) const {
  const Region& r = regions_[size_t(region_of_[slot])];
  return r.data + (host_[slot] - r.host);
}

void GuardedBuffers::load() {
  for (Region& r : regions_) {
    std::memset(r.page_start, kCanary, size_t(r.data - r.page_start));
    if (r.size) std::memcpy(r.data, r.host, r.size);
    std::memset(r.data + r.size, kCanary, size_t(r.page_end - (r.data + r.size)));
  }
}

void GuardedBuffers::store() const {
  const size_t block = page_size();
  for (const Region& r : regions_) {
    // The caller's memory is writable wherever a kernel may write: bytes
    // buffers are the bindings' own copies, tensors are writable.
    auto* host = const_cast<char*>(r.host);
    for (size_t at = 0; at < r.size; at += block) {
      const size_t n = std::min(block, r.size - at);
      if (std::memcmp(host + at, r.data + at, n) != 0) std::memcpy(host + at, r.data + at, n);
    }
  }
}

std::vector<std::vector<unsigned char>> GuardedBuffers::contents() const {
  std::vector<std::vector<unsigned char>> out(kMaxBufferSlots);
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    if (region_of_[i] < 0) continue;
    const char* d = static_cast<const char*>(data(i));
    out[i].assign(d, d + size_[i]);
  }
  return out;
}

std::string GuardedBuffers::slots_of(const Region& r) const {
  std::string s;
  for (uint32_t i : r.slots) s += (s.empty() ? "buffer(" : "/buffer(") + std::to_string(i) + ")";
  return s;
}

std::string GuardedBuffers::check_canaries() const {
  for (const Region& r : regions_) {
    for (const char* p = r.page_start; p < r.page_end; ++p) {
      if (p == r.data) p += r.size;
      if (p >= r.page_end) break;
      if (static_cast<unsigned char>(*p) != kCanary) {
        std::ostringstream report;
        report << "out-of-bounds write to " << slots_of(r) << " at byte offset " << (p - r.data)
               << " (the buffer holds " << r.size << " bytes); found after the run, so the writing thread is unknown";
        return report.str();
      }
    }
  }
  return "";
}

std::string GuardedBuffers::describe(const void* addr, const char* access) const {
  const char* a = static_cast<const char*>(addr);
  for (const Region& r : regions_) {
    if (a < r.mapping || a >= r.mapping + r.mapping_bytes) continue;
    if (a >= r.page_start && a < r.page_end) return "";
    std::ostringstream m;
    m << "out-of-bounds " << access << " of " << slots_of(r) << " at byte offset " << (a - r.data)
      << " (the buffer holds " << r.size << " bytes)";
    return m.str();
  }
  return "";
}

}  // namespace mtlsim
