// Stand-in for Apple's Foundation framework header, for tools/check_macos.py
// only: the declarations that csrc/metal and torch's MPS headers use, as the
// macOS SDK declares them (names, selectors, types), so a syntax check on
// Linux catches a misspelt selector or a wrong type. NSObject itself, BOOL and
// NSInteger/NSUInteger come from the real <objc/...> headers.
#pragma once

#import <Availability.h>
#import <dispatch/dispatch.h>  // Foundation brings libdispatch (NSOperation.h uses it)
#import <objc/NSObject.h>
#import <os/availability.h>

#define NS_ENUM(type, name) enum name : type name; enum name : type
#define NS_ASSUME_NONNULL_BEGIN _Pragma("clang assume_nonnull begin")
#define NS_ASSUME_NONNULL_END _Pragma("clang assume_nonnull end")

typedef double CFTimeInterval;  // CoreFoundation's CFDate.h, which Foundation brings

NS_ASSUME_NONNULL_BEGIN

@interface NSString : NSObject
+ (nullable instancetype)stringWithUTF8String:(const char*)nullTerminatedCString;
@property(nullable, readonly) const char* UTF8String __attribute__((objc_returns_inner_pointer));
@end

@interface NSError : NSObject
@property(readonly) NSInteger code;
@property(readonly, copy) NSString* localizedDescription;
@end

@interface NSDictionary<__covariant KeyType, __covariant ObjectType> : NSObject
@end

NS_ASSUME_NONNULL_END
