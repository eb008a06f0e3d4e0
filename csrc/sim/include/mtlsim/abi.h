// The contract between translated kernel modules and the simulator runtime.
//
// A kernel module (one translated .metal file) is compiled either into the
// extension itself or into a shared library loaded at run time; in both cases
// it talks to the runtime only through the plain structs below, so a module
// never links against the runtime and the runtime knows nothing about the
// kernels it runs. Bump kAbiVersion whenever a layout here changes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mtlsim {

constexpr uint32_t kAbiVersion = 3;
constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kMaxThreadsPerThreadgroup = 1024;
constexpr uint32_t kMaxThreadgroupMemory = 32 * 1024;
// Metal's argument table: buffer(0..30), threadgroup(0..30).
constexpr uint32_t kMaxBufferSlots = 31;

struct Dim3 {
  uint32_t x, y, z;
};

// A source position; kernels pass __FILE__/__LINE__ of the .metal file (the
// translator keeps #line directives) so reports point at the kernel source.
struct Site {
  const char* file;
  uint32_t line;
  uint32_t column;
};

// What every thread of a dispatch can observe. Dispatch-wide parts live in
// DispatchView and are shared by pointer.
struct DispatchView {
  void* const* buffers;         // kMaxBufferSlots entries, nullptr if unbound
  const size_t* buffer_sizes;   // bytes bound at each slot
  Dim3 threadgroups_per_grid;
  Dim3 threads_per_grid;
  Dim3 dispatch_threads_per_threadgroup;
  uint32_t dispatch_simdgroups_per_threadgroup;
  uint32_t flush_half_subnormals;  // 1: half subnormals read and written as zeros, as a GPU may
};

struct ThreadgroupView {
  void* const* buffers;         // [[threadgroup(n)]] memory, kMaxBufferSlots entries
  const size_t* buffer_sizes;
  Dim3 threadgroup_position_in_grid;
  Dim3 threads_per_threadgroup;  // actual size: smaller at the edge of a non-uniform grid
  uint32_t simdgroups_per_threadgroup;
};

struct ThreadCtx {
  const DispatchView* dispatch;
  const ThreadgroupView* group;
  Dim3 thread_position_in_grid;
  Dim3 thread_position_in_threadgroup;
  uint32_t thread_index_in_threadgroup;
};

// Completes a SIMD-group (or quad) operation once every participating lane
// has arrived. in[i]/out[i] point at lane i's argument and result (nullptr for
// lanes outside `mask`); the function is generated per operation and type by
// the shim, so the runtime only moves pointers around.
using CollectiveFn = void (*)(const void* const* in, void* const* out, uint32_t mask);

// One argument of an os_log message (MSL 3.2's <metal_logging>), as the shim
// converts it: the runtime formats the message, so each argument travels with
// its kind instead of as a C variadic argument.
enum class LogArgKind : uint32_t { Signed, Unsigned, Floating, String, Pointer };
struct LogArg {
  LogArgKind kind;
  union {
    int64_t i;
    uint64_t u;
    double f;
    const void* p;  // String: a NUL-terminated text
  };
};

// A message's level: os_log's log() is the default one, log_info() info, and so on
// (numbered as the OS's unified logging numbers its levels).
enum class LogType : uint32_t { Default = 0x00, Info = 0x01, Debug = 0x02, Error = 0x10, Fault = 0x11 };

struct LogMessage {
  const char* subsystem;  // nullptr for os_log_default
  const char* category;
  LogType type;
  const char* format;  // printf's
  uint32_t num_args;
  const LogArg* args;
};

struct RuntimeAPI {
  uint32_t abi_version;
  // Blocks the calling GPU thread until all live lanes of its SIMD group reach
  // the same site, then runs fn once for them. fn == nullptr is a plain
  // simdgroup_barrier.
  void (*collective)(CollectiveFn fn, const void* in, void* out, const Site* site);
  // threadgroup_barrier: blocks until all live threads of the threadgroup arrive.
  void (*barrier)(uint32_t mem_flags, const Site* site);
  // Storage of the threadgroup variable declared at `id` for the current
  // threadgroup: every thread of the group gets the same address.
  void* (*threadgroup_alloc)(uint32_t id, size_t size, size_t align, const Site* site);
  // Lets other GPU threads run (spin loops on atomics would otherwise never
  // see another thread's store: threads run cooperatively).
  void (*yield)();
  // The calling GPU thread.
  const ThreadCtx* (*current)();
  // Aborts the dispatch with an error naming the thread and the site. Never returns.
  void (*fail)(const char* message, const Site* site);
  // An os_log message of the calling GPU thread (see LogMessage).
  void (*log)(const LogMessage* message, const Site* site);
};

enum class ArgKind : uint32_t { Buffer, Threadgroup, Attribute };

// Kernel parameter attributes, named exactly as in MSL so the translator can
// emit them verbatim.
enum class Attr : uint32_t {
  thread_position_in_grid,
  thread_position_in_threadgroup,
  threadgroup_position_in_grid,
  threads_per_threadgroup,
  threadgroups_per_grid,
  threads_per_grid,
  dispatch_threads_per_threadgroup,
  grid_origin,
  grid_size,
  thread_index_in_threadgroup,
  thread_index_in_simdgroup,
  thread_index_in_quadgroup,
  simdgroup_index_in_threadgroup,
  quadgroup_index_in_threadgroup,
  simdgroups_per_threadgroup,
  quadgroups_per_threadgroup,
  dispatch_simdgroups_per_threadgroup,
  dispatch_quadgroups_per_threadgroup,
  threads_per_simdgroup,
  thread_execution_width,
};

struct KernelArg {
  ArgKind kind;
  uint32_t index;  // buffer / threadgroup slot, or an Attr
};

struct KernelInfo {
  const char* host_name;
  void (*entry)(const ThreadCtx*);
  const char* file;
  uint32_t line;
  uint32_t max_total_threads_per_threadgroup;  // 0: no [[max_total_threads_per_threadgroup]]
  uint32_t num_args;
  const KernelArg* args;
  // Bytes of its threadgroup variables, as Metal's staticThreadgroupMemoryLength
  // (0 where not computed: instantiations with deduced template arguments, sizes
  // that use a local other than a constexpr one).
  uint32_t threadgroup_memory;
};

struct ModuleInfo {
  uint32_t abi_version;
  uint32_t num_kernels;
  const KernelInfo* kernels;
  uint32_t num_threadgroup_sites;  // ids passed to threadgroup_alloc are < this
};

// Every module exports one of these (extern "C"); the runtime passes its API
// table in and gets the module's kernels back.
using ModuleInitFn = const ModuleInfo* (*)(const RuntimeAPI*);

}  // namespace mtlsim
