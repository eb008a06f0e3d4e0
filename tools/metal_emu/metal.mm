// The emulated Metal: command queues, command buffers, compute encoders,
// shared events, libraries and pipelines, with the simulator as the GPU.
//
// What it models, after Apple's documentation: a committed command buffer
// runs on another thread, after a launch latency, once the buffer committed
// before it on its queue has completed or is stalled in an event wait (a wait
// gates the rest of its own buffer only); completion handlers run later still,
// on a thread of their own; a failed command sets the buffer's status to
// MTLCommandBufferStatusError and its error, and skips the rest of the buffer.
// A command buffer retains the buffers its passes bind, not the events it
// signals or waits for: one released before the GPU reached it fails the
// buffer. Opening an encoder, signalling, waiting or committing while an
// encoder is still encoding aborts, as Metal's validation does. The device
// has Apple silicon's limits (32 KiB of threadgroup memory, 1024 threads per
// threadgroup); a pipeline reports the threadgroup memory its kernel declares
// (as the translator sizes it) and the threads its kernel's attribute allows,
// and a dispatch whose pipeline needs more threadgroup memory than the device
// has fails its command buffer.
#import "emu.h"

#include <Block.h>
#include <objc/runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hooks.h"
#include "sim/runtime/runtime.h"
#include "sim/sim_backend.h"

namespace {

// One lock and condition for the whole GPU: buffers' progress and events' values.
std::mutex gpu_mu;
std::condition_variable gpu_cv;
std::string fail_next;  // guarded by gpu_mu
// The next library compiles fail: with a compile error, or as the compiler service does when it is
// interrupted (MTLLibraryErrorInternal), which the next try may not meet.
struct CompileFailure {
  std::string message;
  bool compile_error;
};
std::vector<CompileFailure> fail_compiles;  // guarded by gpu_mu
std::atomic<int64_t> released_uses{0};

constexpr auto kLaunchLatency = std::chrono::microseconds(500);

// The threadgroup memory Metal's shader validation adds to every pipeline
// (MPS_EXT_METAL_EMU_VALIDATION_THREADGROUP_BYTES, read once; default 0: no
// validation), which a pipeline that declares all of the device's leaves no
// room for.
NSUInteger validation_threadgroup_bytes() {
  static const NSUInteger bytes = [] {
    const char* value = std::getenv("MPS_EXT_METAL_EMU_VALIDATION_THREADGROUP_BYTES");
    return value ? NSUInteger(std::strtoul(value, nullptr, 10)) : NSUInteger(0);
  }();
  return bytes;
}

// The emulated GPU's kind, read once: the newest Apple family it supports
// (MPS_EXT_METAL_EMU_APPLE_FAMILY, default 9, an M3; 0: not an Apple GPU, as
// an Intel Mac's AMD GPU is) and the threads of its SIMD groups
// (MPS_EXT_METAL_EMU_SIMD_WIDTH, default 32; 64 on those AMD GPUs).
NSUInteger env_or(const char* name, NSUInteger fallback) {
  const char* value = std::getenv(name);
  return value ? NSUInteger(std::strtoul(value, nullptr, 10)) : fallback;
}
NSUInteger apple_family() {
  static const NSUInteger family = env_or("MPS_EXT_METAL_EMU_APPLE_FAMILY", 9);
  return family;
}
NSUInteger simd_width() {
  static const NSUInteger width = env_or("MPS_EXT_METAL_EMU_SIMD_WIDTH", 32);
  return width;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Completion handlers run here, one at a time, in completion order.
class HandlerThread {
 public:
  void post(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    jobs_.push_back(std::move(job));
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::thread thread_;
};

HandlerThread& handlers() {
  static auto* thread = new HandlerThread;  // never joined: it outlives every buffer
  return *thread;
}

struct BufferState {
  std::vector<emu::Command> commands;
  std::vector<MTLCommandBufferHandler> handlers;  // Block_copy'd
  MTLCommandBufferStatus status = MTLCommandBufferStatusNotEnqueued;  // guarded by gpu_mu from commit on
  std::string error;
  bool stalled = false;  // in an event wait
  bool encoding = false;
  double start = 0, end = 0;
  std::shared_ptr<BufferState> before;  // the buffer committed before it on its queue
};

bool done(const BufferState& s) { return s.status >= MTLCommandBufferStatusCompleted; }

}  // namespace

@interface EmuBuffer : NSObject <MTLBuffer> {
  void* contents_;
  NSUInteger length_;
}
- (instancetype)initWithLength:(NSUInteger)length;
@end

@implementation EmuBuffer
- (instancetype)initWithLength:(NSUInteger)length {
  length_ = length;
  contents_ = calloc(length ? length : 1, 1);
  return self;
}
- (void*)contents {
  return contents_;
}
- (NSUInteger)length {
  return length_;
}
- (void)dealloc {
  free(contents_);
  contents_ = nullptr;
  [super dealloc];
}
@end

@interface EmuFunction : NSObject <MTLFunction> {
 @public
  const mtlsim::Module* module_;
  const mtlsim::KernelInfo* kernel_;
}
@end
@implementation EmuFunction
@end

@interface EmuPipeline : NSObject <MTLComputePipelineState> {
 @public
  const mtlsim::Module* module_;
  const mtlsim::KernelInfo* kernel_;
}
@end
@implementation EmuPipeline
- (NSUInteger)maxTotalThreadsPerThreadgroup {
  return kernel_->max_total_threads_per_threadgroup ? kernel_->max_total_threads_per_threadgroup
                                                    : mtlsim::kMaxThreadsPerThreadgroup;
}
- (NSUInteger)threadExecutionWidth {
  return simd_width();
}
// What the kernel's threadgroup variables take, plus what shader validation adds.
- (NSUInteger)staticThreadgroupMemoryLength {
  return kernel_->threadgroup_memory + validation_threadgroup_bytes();
}
@end

@interface EmuLibrary : NSObject <MTLLibrary>
@end
@implementation EmuLibrary
// The kernels were compiled for the simulator from the same sources at build time.
- (id<MTLFunction>)newFunctionWithName:(NSString*)name {
  const mtlsim::Module* module = nullptr;
  const mtlsim::KernelInfo* kernel = mps_ext::builtin_kernel(name.UTF8String, &module);
  if (!kernel) return nil;
  EmuFunction* function = [[EmuFunction alloc] init];
  function->module_ = module;
  function->kernel_ = kernel;
  return function;
}
@end

// The simulator's kernels follow IEEE semantics, in the language of their
// sources: the options change nothing.
@implementation MTLCompileOptions
- (BOOL)fastMathEnabled {
  return NO;
}
- (void)setFastMathEnabled:(BOOL)enabled {
}
- (MTLLanguageVersion)languageVersion {
  return MTLLanguageVersion3_1;
}
- (void)setLanguageVersion:(MTLLanguageVersion)version {
}
@end

@interface EmuEvent : NSObject <MTLSharedEvent> {
 @public
  uint64_t value_;  // guarded by gpu_mu
}
@end
@implementation EmuEvent
- (uint64_t)signaledValue {
  std::lock_guard<std::mutex> lock(gpu_mu);
  return value_;
}
- (void)setSignaledValue:(uint64_t)value {
  {
    std::lock_guard<std::mutex> lock(gpu_mu);
    value_ = value;
  }
  gpu_cv.notify_all();
}
- (void)notifyListener:(MTLSharedEventListener*)listener
               atValue:(uint64_t)value
                 block:(MTLSharedEventNotificationBlock)block {
  emu::fail("notifyListener:atValue:block: is not emulated");
}
@end

@interface EmuCommandBuffer : NSObject <MTLCommandBuffer> {
 @public
  std::shared_ptr<BufferState>* state_;
  std::shared_ptr<BufferState>* last_;  // the queue's
  NSError* error_;
}
- (instancetype)initAfter:(std::shared_ptr<BufferState>*)last;
@end

@interface EmuEncoder : NSObject <MTLComputeCommandEncoder> {
  EmuCommandBuffer* buffer_;
  EmuPipeline* pipeline_;
  id<MTLBuffer> buffers_[mtlsim::kMaxBufferSlots];
  NSUInteger offsets_[mtlsim::kMaxBufferSlots];
  std::vector<uint8_t>* bytes_;  // per slot
}
- (instancetype)initWithBuffer:(EmuCommandBuffer*)buffer;
@end

@implementation EmuEncoder
- (instancetype)initWithBuffer:(EmuCommandBuffer*)buffer {
  buffer_ = buffer;
  bytes_ = new std::vector<uint8_t>[mtlsim::kMaxBufferSlots];
  return self;
}
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state {
  pipeline_ = (EmuPipeline*)state;
}
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index {
  buffers_[index] = buffer;
  offsets_[index] = offset;
  bytes_[index].clear();
}
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index {
  if (length > 4096) emu::fail("setBytes:length:atIndex: takes at most 4 KiB");
  buffers_[index] = nil;
  bytes_[index].assign(static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + length);
}
- (void)dispatchThreadgroups:(MTLSize)groups threadsPerThreadgroup:(MTLSize)threads {
  if (!pipeline_) emu::fail("dispatch without a compute pipeline state");
  mtlsim::Launch launch;
  launch.module = pipeline_->module_;
  launch.kernel = pipeline_->kernel_;
  launch.grid_in_threads = false;
  launch.grid = mtlsim::Dim3{uint32_t(groups.width), uint32_t(groups.height), uint32_t(groups.depth)};
  launch.threadgroup = mtlsim::Dim3{uint32_t(threads.width), uint32_t(threads.height), uint32_t(threads.depth)};
  // Bound buffers live until the pass has run (Metal's retained references);
  // bytes are copied now.
  std::vector<id<MTLBuffer>> retained;
  auto bytes = std::make_shared<std::vector<std::vector<uint8_t>>>(mtlsim::kMaxBufferSlots);
  for (uint32_t i = 0; i < mtlsim::kMaxBufferSlots; ++i) {
    if (buffers_[i]) retained.push_back([buffers_[i] retain]);
    (*bytes)[i] = bytes_[i];
  }
  std::vector<NSUInteger> offsets(offsets_, offsets_ + mtlsim::kMaxBufferSlots);
  std::vector<id<MTLBuffer>> slots(buffers_, buffers_ + mtlsim::kMaxBufferSlots);
  const NSUInteger threadgroup_memory = pipeline_.staticThreadgroupMemoryLength;
  emu::encode(buffer_, [launch, bytes, slots, offsets, retained, threadgroup_memory]() mutable {
    std::string error;
    {
      std::lock_guard<std::mutex> lock(gpu_mu);
      error.swap(fail_next);
    }
    if (threadgroup_memory > emu::device().maxThreadgroupMemoryLength)
      error = "kernel '" + std::string(launch.kernel->host_name) + "' needs " + std::to_string(threadgroup_memory) +
              " bytes of threadgroup memory; the GPU has " +
              std::to_string(emu::device().maxThreadgroupMemoryLength);
    for (uint32_t i = 0; i < mtlsim::kMaxBufferSlots; ++i) {
      if (slots[i]) {
        char* base = static_cast<char*>([slots[i] contents]);
        launch.buffers[i] = mtlsim::Buffer::bytes(base + offsets[i], [slots[i] length] - offsets[i]);
      } else if (!(*bytes)[i].empty()) {
        launch.buffers[i] = mtlsim::Buffer::bytes((*bytes)[i].data(), (*bytes)[i].size());
      }
    }
    if (error.empty()) {
      try {
        mtlsim::dispatch(launch, mtlsim::default_options());
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    for (id<MTLBuffer> b : retained) [b release];
    return error;
  });
}
- (void)endEncoding {
  (*buffer_->state_)->encoding = false;
}
- (void)dealloc {
  delete[] bytes_;
  [super dealloc];
}
@end

@implementation EmuCommandBuffer
- (instancetype)initAfter:(std::shared_ptr<BufferState>*)last {
  state_ = new std::shared_ptr<BufferState>(std::make_shared<BufferState>());
  last_ = last;
  return self;
}
- (void)checkNotEncoding:(const char*)what {
  if ((*state_)->encoding) emu::fail(what);
}
- (id<MTLComputeCommandEncoder>)computeCommandEncoder {
  [self checkNotEncoding:"computeCommandEncoder: A command encoder is already encoding to this command buffer"];
  (*state_)->encoding = true;
  return [[[EmuEncoder alloc] initWithBuffer:self] autorelease];
}
- (void)encodeSignalEvent:(id<MTLEvent>)event value:(uint64_t)value {
  [self checkNotEncoding:"encodeSignalEvent: A command encoder is already encoding to this command buffer"];
  EmuEvent* e = (EmuEvent*)event;
  emu::encode(self, [e, value]() -> std::string {
    if (emu::is_zombie(e)) {
      ++released_uses;
      return "encodeSignalEvent: the MTLSharedEvent was released before the GPU signalled it";
    }
    {
      std::lock_guard<std::mutex> lock(gpu_mu);
      if (value > e->value_) e->value_ = value;
    }
    gpu_cv.notify_all();
    return "";
  });
}
- (void)encodeWaitForEvent:(id<MTLEvent>)event value:(uint64_t)value {
  [self checkNotEncoding:"encodeWaitForEvent: A command encoder is already encoding to this command buffer"];
  EmuEvent* e = (EmuEvent*)event;
  std::shared_ptr<BufferState> state = *state_;
  emu::encode(self, [e, value, state]() -> std::string {
    std::unique_lock<std::mutex> lock(gpu_mu);
    state->stalled = true;
    gpu_cv.notify_all();
    gpu_cv.wait(lock, [&] { return emu::is_zombie(e) || e->value_ >= value; });
    state->stalled = false;
    if (emu::is_zombie(e)) {
      ++released_uses;
      return "encodeWaitForEvent: the MTLSharedEvent was released before the GPU waited for it";
    }
    return "";
  });
}
- (void)addCompletedHandler:(MTLCommandBufferHandler)block {
  if ((*state_)->status != MTLCommandBufferStatusNotEnqueued) emu::fail("addCompletedHandler: after commit");
  (*state_)->handlers.push_back(Block_copy(block));
}
- (void)commit {
  [self checkNotEncoding:"commit: A command encoder is already encoding to this command buffer"];
  std::shared_ptr<BufferState> state = *state_;
  {
    std::lock_guard<std::mutex> lock(gpu_mu);
    if (state->status != MTLCommandBufferStatusNotEnqueued) emu::fail("commit: the command buffer was committed");
    state->status = MTLCommandBufferStatusCommitted;
    state->before = *last_;
    *last_ = state;
  }
  // The GPU holds the buffer until its handlers have run.
  id<MTLCommandBuffer> me = [self retain];
  std::thread([state, me] {
    std::this_thread::sleep_for(kLaunchLatency);
    {
      std::unique_lock<std::mutex> lock(gpu_mu);
      gpu_cv.wait(lock, [&] { return !state->before || done(*state->before) || state->before->stalled; });
      state->before.reset();
      state->start = now_seconds();
    }
    std::string error;
    for (emu::Command& command : state->commands)
      if ((error = command()).size()) break;
    state->commands.clear();
    {
      std::lock_guard<std::mutex> lock(gpu_mu);
      state->end = now_seconds();
      state->error = error;
      state->status = error.empty() ? MTLCommandBufferStatusCompleted : MTLCommandBufferStatusError;
      // Queued with the status, so that no buffer that starts after this one completed (and may complete
      // before this thread runs again) has its handlers run first.
      handlers().post([state, me] {
        for (MTLCommandBufferHandler handler : state->handlers) {
          handler(me);
          Block_release(handler);
        }
        state->handlers.clear();
        [me release];
      });
    }
    gpu_cv.notify_all();
  }).detach();
}
- (void)waitUntilCompleted {
  std::shared_ptr<BufferState> state = *state_;
  std::unique_lock<std::mutex> lock(gpu_mu);
  if (state->status == MTLCommandBufferStatusNotEnqueued) emu::fail("waitUntilCompleted: not committed");
  gpu_cv.wait(lock, [&] { return done(*state); });
}
- (MTLCommandBufferStatus)status {
  std::lock_guard<std::mutex> lock(gpu_mu);
  return (*state_)->status;
}
- (NSError*)error {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(gpu_mu);
    error = (*state_)->error;
  }
  if (error.empty()) return nil;
  if (!error_) error_ = [[NSError emu_errorWithDescription:error.c_str()] retain];
  return error_;
}
- (CFTimeInterval)GPUStartTime {
  std::lock_guard<std::mutex> lock(gpu_mu);
  return (*state_)->start;
}
- (CFTimeInterval)GPUEndTime {
  std::lock_guard<std::mutex> lock(gpu_mu);
  return (*state_)->end;
}
- (void)dealloc {
  [error_ release];
  delete state_;
  [super dealloc];
}
@end

void emu::encode(id<MTLCommandBuffer> buffer, Command command) {
  if (object_getClass(buffer) == objc_getClass("EmuMPSCommandBuffer"))
    buffer = ((MPSCommandBuffer*)buffer).rootCommandBuffer;
  BufferState& state = *((EmuCommandBuffer*)buffer)->state_->get();
  if (state.status != MTLCommandBufferStatusNotEnqueued) emu::fail("encoding into a committed command buffer");
  state.commands.push_back(std::move(command));
}

@interface EmuQueue : NSObject <MTLCommandQueue> {
  std::shared_ptr<BufferState>* last_;
}
@end
@implementation EmuQueue
- (instancetype)init {
  last_ = new std::shared_ptr<BufferState>;
  return self;
}
- (void)dealloc {
  delete last_;
  [super dealloc];
}
- (id<MTLCommandBuffer>)commandBuffer {
  return [[[EmuCommandBuffer alloc] initAfter:last_] autorelease];
}
@end

// MetalPerformanceShaders' command buffer: commitAndContinue commits the
// underlying buffer and goes on in a new one of the same queue. As Apple
// documents them, rootCommandBuffer is the underlying buffer now (the one the
// next commitAndContinue commits), commandBuffer the one it was made with.
@interface EmuMPSCommandBuffer : MPSCommandBuffer {
 @public
  id<MTLCommandQueue> queue_;
  id<MTLCommandBuffer> initial_;
  id<MTLCommandBuffer> current_;
}
@end

// Its instances are EmuMPSCommandBuffers, which implement the rest.
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wprotocol"
#pragma clang diagnostic ignored "-Wincomplete-implementation"
#pragma clang diagnostic ignored "-Wobjc-property-implementation"
@implementation MPSCommandBuffer
+ (instancetype)commandBufferFromCommandQueue:(id<MTLCommandQueue>)queue {
  EmuMPSCommandBuffer* b = [[EmuMPSCommandBuffer alloc] init];
  b->queue_ = [queue retain];
  b->current_ = [[queue commandBuffer] retain];
  b->initial_ = [b->current_ retain];
  return [b autorelease];
}
@end
#pragma clang diagnostic pop

@implementation EmuMPSCommandBuffer
- (id<MTLCommandBuffer>)commandBuffer {
  return initial_;
}
- (id<MTLCommandBuffer>)rootCommandBuffer {
  return current_;
}
- (void)commitAndContinue {
  [current_ commit];
  [current_ release];
  current_ = [[queue_ commandBuffer] retain];
}
- (id<MTLComputeCommandEncoder>)computeCommandEncoder {
  return [current_ computeCommandEncoder];
}
- (void)encodeSignalEvent:(id<MTLEvent>)event value:(uint64_t)value {
  [current_ encodeSignalEvent:event value:value];
}
- (void)encodeWaitForEvent:(id<MTLEvent>)event value:(uint64_t)value {
  [current_ encodeWaitForEvent:event value:value];
}
- (void)addCompletedHandler:(MTLCommandBufferHandler)block {
  [current_ addCompletedHandler:block];
}
- (void)commit {
  [current_ commit];
}
- (void)waitUntilCompleted {
  [current_ waitUntilCompleted];
}
- (MTLCommandBufferStatus)status {
  return current_.status;
}
- (NSError*)error {
  return current_.error;
}
- (CFTimeInterval)GPUStartTime {
  return current_.GPUStartTime;
}
- (CFTimeInterval)GPUEndTime {
  return current_.GPUEndTime;
}
- (void)dealloc {
  [initial_ release];
  [current_ release];
  [queue_ release];
  [super dealloc];
}
@end

@implementation MTLArchitecture
- (NSString*)name {
  return [NSString stringWithUTF8String:"applegpu_g15s"];
}
@end

@interface EmuDevice : NSObject <MTLDevice>
@end
@implementation EmuDevice
- (NSString*)name {
  return [NSString stringWithUTF8String:"metal_emu (the mps_ext simulator)"];
}
- (MTLArchitecture*)architecture {
  return [[[MTLArchitecture alloc] init] autorelease];
}
- (BOOL)hasUnifiedMemory {
  return YES;
}
- (uint64_t)recommendedMaxWorkingSetSize {
  return uint64_t(8) << 30;
}
- (NSUInteger)maxThreadgroupMemoryLength {
  return mtlsim::kMaxThreadgroupMemory;
}
- (BOOL)supportsFamily:(MTLGPUFamily)family {
  return family >= MTLGPUFamilyApple1 && family <= MTLGPUFamilyApple1 + NSInteger(apple_family()) - 1;
}
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source options:(MTLCompileOptions*)options error:(NSError**)error {
  std::lock_guard<std::mutex> lock(gpu_mu);
  if (!fail_compiles.empty()) {
    const CompileFailure f = fail_compiles.front();
    fail_compiles.erase(fail_compiles.begin());
    if (error)
      *error = [NSError emu_errorWithDescription:f.message.c_str()
                                            code:f.compile_error ? MTLLibraryErrorCompileFailure
                                                                 : MTLLibraryErrorInternal];
    return nil;
  }
  return [[EmuLibrary alloc] init];
}
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)function error:(NSError**)error {
  EmuPipeline* pipeline = [[EmuPipeline alloc] init];
  pipeline->module_ = ((EmuFunction*)function)->module_;
  pipeline->kernel_ = ((EmuFunction*)function)->kernel_;
  return pipeline;
}
- (id<MTLCommandQueue>)newCommandQueue {
  return [[EmuQueue alloc] init];
}
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options {
  return [[EmuBuffer alloc] initWithLength:length];
}
- (id<MTLSharedEvent>)newSharedEvent {
  return [[EmuEvent alloc] init];
}
@end

id<MTLDevice> emu::device() {
  static id<MTLDevice> device = [[EmuDevice alloc] init];
  return device;
}

void emu::fail_next_compiles(const std::string& message, int64_t count, bool compile_error) {
  std::lock_guard<std::mutex> lock(gpu_mu);
  fail_compiles.assign(size_t(count), CompileFailure{message, compile_error});
}

void emu::fail_next_kernel(const std::string& message) {
  std::lock_guard<std::mutex> lock(gpu_mu);
  fail_next = message;
}

int64_t emu::released_object_uses() { return released_uses.load(); }
