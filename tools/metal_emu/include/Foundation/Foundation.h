// The emulation's Foundation (tools/metal_emu): what csrc/metal, torch's MPS
// headers and tools/macos_sdk_stubs/ (whose Metal declarations the emulation
// shares) use, on the GNU Objective-C runtime. NSObject is a root class with
// manual reference counting; a released object is kept as a zombie, so a
// message or a GPU command that reaches it fails loudly instead of reading
// freed memory.
#pragma once

#include <dispatch/dispatch.h>
#include <objc/objc.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
// What macOS's libc++ headers include along the way, which torch's MPS
// headers rely on (MPSEvent.h uses std::condition_variable unincluded).
#include <condition_variable>
#include <functional>
#include <mutex>
#endif

#define NS_ENUM(type, name) enum name : type name; enum name : type
#define NS_ASSUME_NONNULL_BEGIN _Pragma("clang assume_nonnull begin")
#define NS_ASSUME_NONNULL_END _Pragma("clang assume_nonnull end")
#define API_AVAILABLE(...)
#define API_DEPRECATED(...)

typedef unsigned long NSUInteger;
typedef long NSInteger;
typedef double CFTimeInterval;

// Darwin's libc (torch's MPSEvent.h calls it).
static inline uint64_t clock_gettime_nsec_np(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

NS_ASSUME_NONNULL_BEGIN

@protocol NSObject
- (instancetype)retain;
- (oneway void)release;
- (instancetype)autorelease;
- (NSUInteger)retainCount;
@end

__attribute__((objc_root_class))
@interface NSObject <NSObject> {
  Class isa;
  NSUInteger emu_references;  // atomic; 0 once released: a zombie
}
+ (instancetype)alloc;
+ (instancetype)new;
- (instancetype)init;
- (void)dealloc;
@end

@interface NSString : NSObject {
  char* emu_text;
}
+ (nullable instancetype)stringWithUTF8String:(const char*)nullTerminatedCString;
@property(nullable, readonly) const char* UTF8String __attribute__((objc_returns_inner_pointer));
@end

@interface NSError : NSObject {
  NSString* emu_description;
  NSInteger emu_code;
}
@property(readonly) NSInteger code;
@property(readonly, copy) NSString* localizedDescription;
// The emulation's own: an autoreleased error with this description (and code).
+ (instancetype)emu_errorWithDescription:(const char*)description;
+ (instancetype)emu_errorWithDescription:(const char*)description code:(NSInteger)code;
@end

@interface NSDictionary<__covariant KeyType, __covariant ObjectType> : NSObject
@end

// What @autoreleasepool compiles to on the GNU runtime.
@interface NSAutoreleasePool : NSObject
- (void)drain;
@end

NS_ASSUME_NONNULL_END
