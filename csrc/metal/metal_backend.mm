// The Metal backend: compiles the embedded .metal sources on first use,
// caches compute pipelines, and encodes kernels on the current stream
// (metal_streams.h: torch's, or on torch 2.13 one of mps_ext's own) inside its
// dispatch queue, with its shared (coalesced) encoder. It never ends that
// encoder and never commits: torch commits at its sync points.
//
// Built without ARC: torch's MPS headers call retain/release themselves.
// Objects created here with new/alloc are released here, except pipelines
// and libraries, which live as long as the process.
#include <ATen/mps/MPSDevice.h>
#include <ATen/mps/MPSStream.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "backend.h"
#include "gpu_fill.h"
#include "metal/metal_backend.h"
#include "metal/metal_streams.h"
#include "metal/sources.h"

namespace mps_ext {

namespace {

std::string describe(NSError* error) {
  return error ? std::string(error.localizedDescription.UTF8String) : std::string("no details");
}

// IEEE semantics (NaN, inf, -0) as torch's CPU kernels have them: the kernels
// compare with -INFINITY and propagate NaN, which fast math may drop.
void use_safe_math(MTLCompileOptions* options) {
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
#if defined(__MAC_OS_X_VERSION_MAX_ALLOWED) && __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
  if (@available(macOS 15.0, *)) {
    options.mathMode = MTLMathModeSafe;
    return;
  }
#endif
  options.fastMathEnabled = NO;
#pragma clang diagnostic pop
}

// The SIMD-group width every kernel is written for (Apple GPUs').
constexpr NSUInteger kSimdWidth = 32;

// The GPU's core count: torch reads the gpu-core-count property of the GPU's
// IOKit accelerator entry (and throws when there is none); else the smallest
// chip of the device's architecture tier.
int64_t gpu_cores(id<MTLDevice> device) {
  try {
    if (const unsigned cores = at::mps::MPSDevice::getInstance()->getCoreCount()) return cores;
  } catch (const c10::Error&) {
  }
  return cores_of_architecture(device.architecture.name.UTF8String);
}

class MetalBackend final : public Backend {
 public:
  explicit MetalBackend(id<MTLDevice> device)
      : device_(device), fill_(fill_simdgroups_for_cores(gpu_cores(device))) {
    const auto& all = metal::sources();
    libraries_.assign(all.size(), nil);
    library_errors_.resize(all.size());
    for (size_t i = 0; i < all.size(); ++i)
      for (const char* kernel : all[i].kernels) source_of_[kernel] = i;
  }

  const char* name() const override { return "metal"; }

  std::optional<std::string> unavailable(const std::string& kernel, uint32_t threads) override {
    std::string error;
    const id<MTLComputePipelineState> pipeline = pipeline_for(kernel, &error);
    if (!pipeline) return error;
    if (threads > pipeline.maxTotalThreadsPerThreadgroup)
      return "kernel '" + kernel + "' allows " + std::to_string(pipeline.maxTotalThreadsPerThreadgroup) +
             " threads per threadgroup on this GPU";
    return std::nullopt;
  }

  int64_t fill_simdgroups(const std::string&, uint32_t) override { return fill_; }

  void dispatch(const Launch& launch) override {
    std::string error;
    const id<MTLComputePipelineState> pipeline = pipeline_for(launch.kernel, &error);
    TORCH_CHECK(pipeline, "mps_ext: ", error);
    const Size3 groups = launch.threadgroups, threads = launch.threads_per_threadgroup;
    const uint64_t per_group = uint64_t(threads.x) * threads.y * threads.z;
    TORCH_CHECK(per_group <= pipeline.maxTotalThreadsPerThreadgroup, "mps_ext: kernel '", launch.kernel, "' runs ",
                per_group, " threads per threadgroup; this GPU allows ", pipeline.maxTotalThreadsPerThreadgroup);
    metal_streams::free_released();
    const Launch* l = &launch;  // dispatch_sync runs the block before returning
    at::mps::MPSStream* stream = metal_streams::current();
    const bool keep_tensors = stream != at::mps::getDefaultMPSStream();
    metal_streams::after_torch_work(stream);
    at::mps::dispatch_sync_with_rethrow(stream->queue(), ^() {
      // Drains what Metal autoreleases here on threads that have no pool of their own.
      @autoreleasepool {
        metal_streams::before_encoding(stream);
        id<MTLComputeCommandEncoder> encoder = stream->commandEncoder();
        [encoder setComputePipelineState:pipeline];
        for (NSUInteger i = 0; i < l->args.size(); ++i) {
          const Arg& a = l->args[i];
          if (a.is_tensor()) {
            // An MPS tensor's storage pointer is its MTLBuffer.
            [encoder setBuffer:__builtin_bit_cast(id<MTLBuffer>, a.tensor.storage().data())
                        offset:NSUInteger(a.tensor.storage_offset()) * a.tensor.element_size()
                       atIndex:i];
          } else {
            [encoder setBytes:a.bytes.data() length:a.bytes.size() atIndex:i];
          }
        }
        [encoder dispatchThreadgroups:MTLSizeMake(groups.x, groups.y, groups.z)
                threadsPerThreadgroup:MTLSizeMake(threads.x, threads.y, threads.z)];
        // Off the default stream, torch's allocator could hand the memory to
        // other work before this kernel ran: the launch holds its tensors.
        if (keep_tensors) {
          std::vector<at::Tensor> tensors;
          for (const Arg& a : l->args)
            if (a.is_tensor()) tensors.push_back(a.tensor);
          metal_streams::keep_until_completed(stream, std::move(tensors));
        }
      }
    });
  }

  int64_t new_stream() override { return metal_streams::new_stream(); }
  int64_t current_stream() override { return metal_streams::current_id(); }
  void set_current_stream(int64_t stream) override { metal_streams::set_current(stream); }
  void synchronize(int64_t stream) override { metal_streams::synchronize(stream); }
  bool query(int64_t stream) override { return metal_streams::query(stream); }
  std::unique_ptr<Event> new_event() override { return metal_streams::new_event(device_); }
  void record_tensor(const at::Tensor& t, int64_t stream) override { metal_streams::record_tensor(t, stream); }
  void wait_torch_event(int64_t stream, int64_t event_id) override {
    metal_streams::wait_torch_event(stream, event_id);
  }
  void before_torch_ops() override { metal_streams::before_torch_ops(); }

  id<MTLDevice> device() const { return device_; }

 private:
  // The kernel's pipeline, or nil with *error set. Ops run on any thread
  // (autograd's, the user's). A compile holds compile_mu_ only, so kernels
  // already built dispatch meanwhile; mu_ guards the caches. Failures that
  // the same source meets again (a compile error, a missing function, too
  // much threadgroup memory) are remembered, so a broken kernel is compiled
  // once; the compiler service's own failures are tried again next time.
  id<MTLComputePipelineState> pipeline_for(const std::string& kernel, std::string* error) {
    if (std::optional<id<MTLComputePipelineState>> known = cached(kernel, error)) return *known;
    std::lock_guard<std::mutex> compiling(compile_mu_);
    if (std::optional<id<MTLComputePipelineState>> known = cached(kernel, error)) return *known;
    auto source = source_of_.find(kernel);
    bool lasting = true;  // whether a failure would recur
    id<MTLLibrary> library = source == source_of_.end() ? nil : library_for(source->second, error, &lasting);
    id<MTLComputePipelineState> pipeline = nil;
    if (source == source_of_.end()) {
      *error = "no Metal kernel named '" + kernel + "' in this build";
    } else if (library) {
      @autoreleasepool {
        id<MTLFunction> function = [library newFunctionWithName:[NSString stringWithUTF8String:kernel.c_str()]];
        if (!function) {
          *error = "the compiled library has no function named '" + kernel + "'";
        } else {
          NSError* ns_error = nil;
          pipeline = [device_ newComputePipelineStateWithFunction:function error:&ns_error];
          if (!pipeline) {
            *error = "creating the pipeline of '" + kernel + "' failed: " + describe(ns_error);
            lasting = recurs(ns_error);
          }
          if (pipeline && pipeline.threadExecutionWidth != kSimdWidth) {
            *error = "kernel '" + kernel + "' would run SIMD groups of " +
                     std::to_string(pipeline.threadExecutionWidth) + " threads on this GPU; it is written for " +
                     std::to_string(kSimdWidth);
            [pipeline release];
            pipeline = nil;
          }
          // What the kernel declares plus what the compiler (or shader validation) adds.
          if (pipeline && pipeline.staticThreadgroupMemoryLength > device_.maxThreadgroupMemoryLength) {
            *error = "kernel '" + kernel + "' needs " + std::to_string(pipeline.staticThreadgroupMemoryLength) +
                     " bytes of threadgroup memory; this GPU has " +
                     std::to_string(device_.maxThreadgroupMemoryLength);
            [pipeline release];
            pipeline = nil;
          }
          [function release];
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (pipeline) {
      pipelines_.emplace(kernel, pipeline);
    } else if (lasting) {
      pipeline_errors_.emplace(kernel, *error);
    }
    return pipeline;
  }

  // The cache's pipeline or remembered failure (nil, *error set), or nothing.
  std::optional<id<MTLComputePipelineState>> cached(const std::string& kernel, std::string* error) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pipelines_.find(kernel);
    if (it != pipelines_.end()) return it->second;
    auto failed = pipeline_errors_.find(kernel);
    if (failed == pipeline_errors_.end()) return std::nullopt;
    *error = failed->second;
    return static_cast<id<MTLComputePipelineState>>(nil);
  }

  // Whether a compile that failed with `error` fails again on the same source: a compile error does, the
  // compiler service's own failures (MTLLibraryErrorInternal: interrupted, timed out) need not.
  static bool recurs(NSError* error) { return !error || error.code != MTLLibraryErrorInternal; }

  // Callers hold compile_mu_, which guards libraries_ and library_errors_.
  id<MTLLibrary> library_for(size_t index, std::string* error, bool* lasting) {
    if (libraries_[index]) return libraries_[index];
    if (!library_errors_[index].empty()) {
      *error = library_errors_[index];
      return nil;
    }
    const metal::Source& source = metal::sources()[index];
    id<MTLLibrary> library = nil;
    @autoreleasepool {
      MTLCompileOptions* options = [[MTLCompileOptions alloc] init];
      options.languageVersion = MTLLanguageVersion3_1;  // bfloat; macOS 14
      use_safe_math(options);
      NSError* ns_error = nil;
      library = [device_ newLibraryWithSource:[NSString stringWithUTF8String:source.text]
                                      options:options
                                        error:&ns_error];
      if (!library) {
        *error = std::string("compiling ") + source.file + " failed: " + describe(ns_error);
        *lasting = recurs(ns_error);
        if (*lasting) library_errors_[index] = *error;
      }
      [options release];
    }
    libraries_[index] = library;
    return library;
  }

  id<MTLDevice> device_;
  const int64_t fill_;  // read once: the GPU does not change
  std::mutex mu_, compile_mu_;
  std::unordered_map<std::string, size_t> source_of_;
  std::vector<id<MTLLibrary>> libraries_;
  std::vector<std::string> library_errors_;
  std::unordered_map<std::string, id<MTLComputePipelineState>> pipelines_;
  std::unordered_map<std::string, std::string> pipeline_errors_;
};

// Why the backend is not there, once instance() has run.
std::string& unavailable_why() {
  static std::string why;
  return why;
}

// The kernels are written for Apple GPUs, the Apple7 family (M1) on: SIMD groups of 32 threads, bfloat,
// simdgroup matrices. An Intel Mac's AMD GPU (SIMD groups of 64) would run them with wrong results: refused.
MetalBackend* instance() {
  static MetalBackend* backend = []() -> MetalBackend* {
    id<MTLDevice> device = at::mps::is_available() ? at::mps::MPSDevice::getInstance()->device() : nil;
    if (!device) {
      unavailable_why() = "torch finds no MPS device";
      return nullptr;
    }
    if (![device supportsFamily:MTLGPUFamilyApple7]) {
      unavailable_why() = std::string("mps_ext's kernels need an Apple GPU of the Apple7 family (M1) or later, not ") +
                          device.name.UTF8String + ": torch runs every op";
      return nullptr;
    }
    return new MetalBackend(device);
  }();
  return backend;
}

}  // namespace

Backend* metal_backend() { return instance(); }

std::string metal_unavailable_reason() { return instance() ? std::string() : unavailable_why(); }

std::vector<std::pair<std::string, std::string>> metal::device_info() {
  MetalBackend* backend = instance();
  if (!backend) return {};
  @autoreleasepool {
    id<MTLDevice> device = backend->device();
    std::string family;  // one of these: instance() refuses older GPUs
    // MTLGPUFamilyApple10 (M5) has a name from the macOS 26 SDK on only.
    const std::pair<MTLGPUFamily, const char*> families[] = {{static_cast<MTLGPUFamily>(1010), "Apple10 (M5)"},
                                                             {MTLGPUFamilyApple9, "Apple9 (M3/M4)"},
                                                             {MTLGPUFamilyApple8, "Apple8 (M2)"},
                                                             {MTLGPUFamilyApple7, "Apple7 (M1)"}};
    for (const auto& [f, name] : families) {
      if ([device supportsFamily:f]) {
        family = name;
        break;
      }
    }
    return {
        {"name", device.name.UTF8String},
        {"gpu family", family},
        {"gpu cores", std::to_string(gpu_cores(device))},  // as dispatch sizes for them, torch's count or not
        {"unified memory", device.hasUnifiedMemory ? "yes" : "no"},
        {"recommended working set", std::to_string(device.recommendedMaxWorkingSetSize >> 20) + " MiB"},
    };
  }
}

}  // namespace mps_ext
