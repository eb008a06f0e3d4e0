// The emulation's Foundation and libdispatch (include/Foundation, include/dispatch).
#import <Foundation/Foundation.h>

#include <objc/runtime.h>
#include <unwind.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "emu.h"

// Objective-C++ code unwinds through the Objective-C runtime's personality
// routine, and Apple's (__objc_personality_v0) runs C++ catch clauses too:
// csrc/metal catches c10::Error (gpu_cores) and the dispatch blocks rethrow.
// The GCC runtime's routine sees C++ exceptions as foreign and passes them by,
// so that no catch in an .mm file would ever run: the emulation's .mm files
// unwind through C++'s own routine instead, bound here (protected: the
// library's own references resolve to it, not to libobjc's). Nothing here
// throws Objective-C exceptions.
extern "C" _Unwind_Reason_Code __gxx_personality_v0(int, _Unwind_Action, _Unwind_Exception_Class,
                                                    _Unwind_Exception*, _Unwind_Context*);
extern "C" __attribute__((visibility("protected"))) _Unwind_Reason_Code __gnu_objc_personality_v0(
    int version, _Unwind_Action actions, _Unwind_Exception_Class exception_class, _Unwind_Exception* exception,
    _Unwind_Context* context) {
  return __gxx_personality_v0(version, actions, exception_class, exception, context);
}

namespace {

// Objects autoreleased on this thread, one list per open pool. The first is
// the thread's own, drained when the thread ends, as macOS gives every thread.
struct Pools {
  std::vector<std::vector<id>> open{1};
  ~Pools() {
    for (id object : open.front()) [object release];
  }
};
thread_local Pools pools;

}  // namespace

namespace emu {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "metal_emu: %s\n", what);
  std::abort();
}

}  // namespace emu

@implementation NSObject
static std::atomic<NSUInteger>& references(NSObject* object) {
  return *reinterpret_cast<std::atomic<NSUInteger>*>(&object->emu_references);
}
bool emu::is_zombie(id object) { return references(static_cast<NSObject*>(object)).load() == 0; }

+ (instancetype)alloc {
  NSObject* object = class_createInstance(self, 0);
  references(object).store(1);
  return object;
}
+ (instancetype)new {
  return [[self alloc] init];
}
- (instancetype)init {
  return self;
}
- (instancetype)retain {
  if (references(self).fetch_add(1) == 0) emu::fail("retain of a released object");
  return self;
}
- (oneway void)release {
  const NSUInteger before = references(self).fetch_sub(1);
  if (before == 0) emu::fail("release of a released object");
  if (before == 1) [self dealloc];
}
- (instancetype)autorelease {
  pools.open.back().push_back(self);
  return self;
}
- (NSUInteger)retainCount {
  return references(self).load();
}
// A zombie's memory stays: what still points at it sees it released.
- (void)dealloc {
}
@end

@implementation NSAutoreleasePool
- (instancetype)init {
  pools.open.emplace_back();
  return self;
}
- (void)drain {
  std::vector<id> objects = std::move(pools.open.back());
  pools.open.pop_back();
  for (id object : objects) [object release];
  [self release];
}
@end

@implementation NSString
+ (instancetype)stringWithUTF8String:(const char*)text {
  NSString* s = [[self alloc] init];
  s->emu_text = strdup(text);
  return [s autorelease];
}
- (const char*)UTF8String {
  return emu_text;
}
- (void)dealloc {
  free(emu_text);
  emu_text = nullptr;
  [super dealloc];
}
@end

@implementation NSError
+ (instancetype)emu_errorWithDescription:(const char*)description {
  return [self emu_errorWithDescription:description code:0];
}
+ (instancetype)emu_errorWithDescription:(const char*)description code:(NSInteger)code {
  NSError* e = [[self alloc] init];
  e->emu_description = [[NSString stringWithUTF8String:description] retain];
  e->emu_code = code;
  return [e autorelease];
}
- (NSString*)localizedDescription {
  return emu_description;
}
- (NSInteger)code {
  return emu_code;
}
- (void)dealloc {
  [emu_description release];
  [super dealloc];
}
@end

@implementation NSDictionary
@end

struct emu_dispatch_queue {
  std::mutex mu;
  std::atomic<std::thread::id> owner{};
};

dispatch_queue_t dispatch_queue_create(const char*, dispatch_queue_attr_t) { return new emu_dispatch_queue; }

void dispatch_sync(dispatch_queue_t queue, dispatch_block_t block) {
  if (queue->owner.load() == std::this_thread::get_id())
    emu::fail("dispatch_sync called on queue already owned by current thread");
  std::lock_guard<std::mutex> lock(queue->mu);
  queue->owner.store(std::this_thread::get_id());
  struct Release {
    dispatch_queue_t queue;
    ~Release() { queue->owner.store(std::thread::id()); }
  } release{queue};
  block();
}

void dispatch_release(dispatch_queue_t queue) { delete queue; }
