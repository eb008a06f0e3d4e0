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

using Run = GuardedBuffers::Run;

constexpr unsigned char kCanary = 0xA5;
constexpr size_t kTrailingGuard = size_t(64) << 20;
// Page ranges protected one by one, per region; beyond, the whole span is
// accessible (each range takes memory mappings, which a process has few of).
constexpr size_t kMaxPageRanges = 256;

size_t natural_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  size_t align = 16;
  while (align > 1 && a % align) align /= 2;
  return align;
}

// Adds [offset, offset + length) to sorted `runs`, joining it to the last run
// when they touch or overlap; false when it starts before the last run. Runs
// are never joined across a gap, however small: the bytes between a strided
// view's elements are not its own, and a write there must not reach them.
bool append(std::vector<Run>& runs, size_t offset, size_t length) {
  if (!runs.empty()) {
    Run& last = runs.back();
    if (offset < last.offset) return false;
    if (offset <= last.end()) {
      last.length = std::max(last.end(), offset + length) - last.offset;
      return true;
    }
  }
  runs.push_back(Run{offset, length});
  return true;
}

std::vector<Run> merged(std::vector<Run> runs) {
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.offset < b.offset; });
  std::vector<Run> out;
  for (const Run& r : runs) append(out, r.offset, r.length);
  return out;
}

// The byte runs a buffer's elements cover, from its start.
std::vector<Run> element_runs(const Buffer& b) {
  if (!b.size) return {};
  if (b.dims.empty()) return {Run{0, b.size}};
  std::vector<Extent> dims;
  for (const Extent& d : b.dims) {
    if (d.count == 0) return {};
    if (d.count > 1 && d.stride) dims.push_back(d);
  }
  // Addresses do not depend on the order of dimensions: innermost first, the
  // dimensions that continue a contiguous run become part of it.
  std::sort(dims.begin(), dims.end(), [](const Extent& a, const Extent& c) { return a.stride < c.stride; });
  size_t run = b.element;
  size_t inner = 0;
  while (inner < dims.size() && dims[inner].stride == run) run *= dims[inner++].count;
  std::vector<Run> runs;
  std::vector<size_t> index(dims.size(), 0);
  bool ordered = true;
  for (size_t offset = 0;;) {
    if (!append(runs, offset, run)) {
      ordered = false;
      runs.push_back(Run{offset, run});
    }
    size_t d = inner;
    for (; d < dims.size(); ++d) {
      offset += dims[d].stride;
      if (++index[d] < dims[d].count) break;
      offset -= dims[d].stride * dims[d].count;
      index[d] = 0;
    }
    if (d == dims.size()) break;
  }
  // Overlapping strides (as_strided) visit addresses out of order.
  return ordered ? runs : merged(std::move(runs));
}

// The page ranges (in bytes from `base`) that hold the runs starting at `data`.
std::vector<Run> pages_of(const std::vector<Run>& runs, const char* data, const char* base, size_t page) {
  std::vector<Run> pages;
  for (const Run& r : runs) {
    const size_t first = size_t(data + r.offset - base) / page * page;
    const size_t last = (size_t(data + r.end() - base) + page - 1) / page * page;
    append(pages, first, last - first);
  }
  return pages;
}

bool inside(const std::vector<Run>& ranges, size_t offset) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), offset,
                             [](size_t o, const Run& r) { return o < r.offset; });
  return it != ranges.begin() && offset < std::prev(it)->end();
}

}  // namespace

GuardedBuffers::GuardedBuffers(const Launch& launch) {
  region_of_.fill(-1);
  std::vector<uint32_t> bound;
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    if (!launch.buffers[i].data) continue;
    host_[i] = static_cast<const char*>(launch.buffers[i].data);
    size_[i] = launch.buffers[i].size;
    runs_[i] = element_runs(launch.buffers[i]);
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
    Region r;
    r.host = host_[i];
    r.size = size_[i];
    r.slots = {i};
    regions_.push_back(std::move(r));
    region_of_[i] = int(regions_.size() - 1);
  }
  for (Region& r : regions_) {
    if (r.slots.size() == 1) {
      r.runs = runs_[r.slots[0]];
    } else {
      for (uint32_t i : r.slots)
        for (const Run& run : runs_[i]) r.runs.push_back(Run{size_t(host_[i] - r.host) + run.offset, run.length});
      r.runs = merged(std::move(r.runs));
    }
    try {
      map(r);
    } catch (...) {
      for (Region& done : regions_)
        if (done.mapping) munmap(done.mapping, done.mapping_bytes);
      throw;
    }
  }
}

void GuardedBuffers::map(Region& r) {
  const size_t page = page_size();
  const size_t data_pages = (r.size + page - 1) / page;
  // [guard][data pages][guard]: a long guard after the data (address space
  // only) also catches indices far past the end. Data pages without runs
  // stay guards too.
  r.mapping_bytes = (data_pages + 1) * page + kTrailingGuard;
  void* m = mmap(nullptr, r.mapping_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANON | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    throw SimError("cannot map a copy of " + slots_of(r) + " (" + std::to_string(r.size) + " bytes): " +
                   std::strerror(errno));
  r.mapping = static_cast<char*>(m);
  r.page_start = r.mapping + page;
  r.page_end = r.page_start + data_pages * page;
  r.data = r.page_end - r.size;
  r.data -= reinterpret_cast<uintptr_t>(r.data) % natural_alignment(r.host);
  r.pages = pages_of(r.runs, r.data, r.page_start, page);
  r.accessible = r.pages.size() <= kMaxPageRanges ? r.pages : std::vector<Run>{Run{0, data_pages * page}};
  for (const Run& p : r.accessible) {
    if (mprotect(r.page_start + p.offset, p.length, PROT_READ | PROT_WRITE) != 0) {
      const std::string why = std::strerror(errno);
      throw SimError("cannot map a copy of " + slots_of(r) + " (" + std::to_string(r.size) + " bytes): " + why);
    }
  }
}

GuardedBuffers::~GuardedBuffers() {
  for (Region& r : regions_) munmap(r.mapping, r.mapping_bytes);
}

void* GuardedBuffers::data(uint32_t slot) const {
  const Region& r = regions_[size_t(region_of_[slot])];
  return r.data + (host_[slot] - r.host);
}

template <class Fn>
void GuardedBuffers::for_each_gap(const Region& r, Fn fn) {
  auto run = r.runs.begin();
  for (const Run& p : r.pages) {
    char* at = r.page_start + p.offset;
    char* const end = at + p.length;
    for (; run != r.runs.end() && r.data + run->offset < end; ++run) {
      if (r.data + run->offset > at) fn(at, size_t(r.data + run->offset - at));
      at = std::max(at, r.data + run->end());
    }
    if (at < end) fn(at, size_t(end - at));
  }
}

void GuardedBuffers::load() {
  for (Region& r : regions_) {
    if (!loaded_) {
      size_t total = 0;
      for (const Run& run : r.runs) total += run.length;
      r.snapshot.resize(total);
      char* to = r.snapshot.data();
      for (const Run& run : r.runs) to = std::copy_n(r.host + run.offset, run.length, to);
    }
    for_each_gap(r, [](char* p, size_t n) { std::memset(p, kCanary, n); });
    const char* from = r.snapshot.data();
    for (const Run& run : r.runs) {
      std::memcpy(r.data + run.offset, from, run.length);
      from += run.length;
    }
  }
  loaded_ = true;
}

void GuardedBuffers::store() const {
  constexpr size_t kBlock = 64;
  for (const Region& r : regions_) {
    // The caller's memory is writable wherever a kernel may write: bytes
    // buffers are the bindings' own copies, tensors are writable.
    auto* host = const_cast<char*>(r.host);
    const char* before = r.snapshot.data();
    for (const Run& run : r.runs) {
      const char* after = r.data + run.offset;
      for (size_t at = 0; at < run.length;) {
        const size_t n = std::min(kBlock, run.length - at);
        if (std::memcmp(after + at, before + at, n) == 0) {
          at += n;
          continue;
        }
        // Byte by byte within a block that changed: only what the kernel wrote.
        for (const size_t stop = at + n; at < stop;) {
          size_t same = at;
          while (same < stop && after[same] == before[same]) ++same;
          size_t changed = same;
          while (changed < run.length && after[changed] != before[changed]) ++changed;
          std::memcpy(host + run.offset + same, after + same, changed - same);
          at = changed;
        }
      }
      before += run.length;
    }
  }
}

std::vector<std::vector<unsigned char>> GuardedBuffers::contents() const {
  std::vector<std::vector<unsigned char>> out(kMaxBufferSlots);
  for (uint32_t i = 0; i < kMaxBufferSlots; ++i) {
    if (region_of_[i] < 0) continue;
    const char* d = static_cast<const char*>(data(i));
    for (const Run& run : runs_[i]) out[i].insert(out[i].end(), d + run.offset, d + run.end());
  }
  return out;
}

size_t GuardedBuffers::offset_in(uint32_t slot, size_t index) const {
  for (const Run& run : runs_[slot]) {
    if (index < run.length) return run.offset + index;
    index -= run.length;
  }
  return index;
}

std::string GuardedBuffers::slots_of(const Region& r) const {
  std::string s;
  for (uint32_t i : r.slots) s += (s.empty() ? "buffer(" : "/buffer(") + std::to_string(i) + ")";
  return s;
}

std::string GuardedBuffers::check_canaries() const {
  for (const Region& r : regions_) {
    const char* bad = nullptr;
    for_each_gap(r, [&](const char* p, size_t n) {
      for (const char* q = p; !bad && q < p + n; ++q)
        if (static_cast<unsigned char>(*q) != kCanary) bad = q;
    });
    if (bad) {
      std::ostringstream report;
      report << "out-of-bounds write to " << slots_of(r) << " at byte offset " << (bad - r.data)
             << " (the buffer holds " << r.size << " bytes" << (bad > r.data && bad < r.data + r.size ?
                                                                   ", this byte between its elements" : "")
             << "); found after the run, so the writing thread is unknown";
      return report.str();
    }
  }
  return "";
}

std::string GuardedBuffers::describe(const void* addr, const char* access) const {
  const char* a = static_cast<const char*>(addr);
  for (const Region& r : regions_) {
    if (a < r.mapping || a >= r.mapping + r.mapping_bytes) continue;
    const bool between = a >= r.page_start && a < r.page_end;
    if (between && inside(r.accessible, size_t(a - r.page_start))) return "";
    std::ostringstream m;
    m << "out-of-bounds " << access << " of " << slots_of(r) << " at byte offset " << (a - r.data)
      << " (the buffer holds " << r.size << " bytes" << (between ? "; this page holds none of its elements" : "")
      << ")";
    return m.str();
  }
  return "";
}

}  // namespace mtlsim
