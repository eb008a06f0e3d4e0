// Stand-in for Apple's Metal framework header, for tools/check_macos.py and
// the emulated Metal (tools/metal_emu): the declarations that csrc/metal,
// torch's MPS headers and the emulation of torch's MPS runtime use, as the
// macOS SDK declares them (selectors, property and argument types, enum
// values, availability), so a syntax check on Linux catches our mistakes.
// Protocols keep their parents of the macOS 14 SDK.
// __MAC_OS_X_VERSION_MAX_ALLOWED plays the SDK's version: what a macOS 14 SDK
// lacks is left out below 150000, as it is from that SDK.
#pragma once

#import <Foundation/Foundation.h>

NS_ASSUME_NONNULL_BEGIN

// MTLTypes.h
typedef struct {
  NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize size = {width, height, depth};
  return size;
}

// MTLResource.h, MTLBuffer.h
@protocol MTLResource <NSObject>
@end
typedef NS_ENUM(NSUInteger, MTLResourceOptions) {
  MTLResourceStorageModeShared = 0,
} API_AVAILABLE(macos(10.11), ios(8.0));

@protocol MTLBuffer <MTLResource>
@property(readonly) NSUInteger length;
- (void*)contents __attribute__((objc_returns_inner_pointer));
@end

// MTLLibrary.h
typedef NS_ENUM(NSUInteger, MTLLibraryError) {
  MTLLibraryErrorUnsupported = 1,
  MTLLibraryErrorInternal = 2,
  MTLLibraryErrorCompileFailure = 3,
  MTLLibraryErrorCompileWarning = 4,
  MTLLibraryErrorFunctionNotFound API_AVAILABLE(macos(10.12), ios(10.0)) = 5,
  MTLLibraryErrorFileNotFound API_AVAILABLE(macos(10.12), ios(10.0)) = 6,
} API_AVAILABLE(macos(10.11), ios(8.0));
typedef NS_ENUM(NSUInteger, MTLLanguageVersion) {
  MTLLanguageVersion3_1 API_AVAILABLE(macos(14.0), ios(17.0)) = (3 << 16) + 1,
} API_AVAILABLE(macos(10.11), ios(9.0));

#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
typedef NS_ENUM(NSInteger, MTLMathMode) {
  MTLMathModeSafe = 0,
};
#endif

@protocol MTLFunction <NSObject>
@end

@protocol MTLLibrary <NSObject>
- (nullable id<MTLFunction>)newFunctionWithName:(NSString*)functionName;
@end

API_AVAILABLE(macos(10.11), ios(8.0))
@interface MTLCompileOptions : NSObject
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
@property(readwrite, nonatomic) BOOL fastMathEnabled API_DEPRECATED("Use mathMode instead", macos(10.11, 15.0),
                                                                    ios(8.0, 18.0));
@property(readwrite, nonatomic) MTLMathMode mathMode API_AVAILABLE(macos(15.0), ios(18.0));
#else
@property(readwrite, nonatomic) BOOL fastMathEnabled;
#endif
@property(readwrite, nonatomic) MTLLanguageVersion languageVersion API_AVAILABLE(macos(10.11), ios(9.0));
@end

// MTLComputePipeline.h
@protocol MTLComputePipelineState <NSObject>
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property(readonly) NSUInteger threadExecutionWidth;
@property(readonly) NSUInteger staticThreadgroupMemoryLength API_AVAILABLE(macos(11.0), ios(14.0));
@end

// MTLCommandEncoder.h, MTLComputeCommandEncoder.h
@protocol MTLCommandEncoder <NSObject>
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void*)bytes
          length:(NSUInteger)length
         atIndex:(NSUInteger)index API_AVAILABLE(macos(10.11), ios(8.3));
- (void)setBuffer:(nullable id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

// MTLEvent.h, MTLCommandBuffer.h, MTLCommandQueue.h
@protocol MTLEvent <NSObject>
@end
@interface MTLSharedEventListener : NSObject
@end
@protocol MTLSharedEvent;
typedef void (^MTLSharedEventNotificationBlock)(id<MTLSharedEvent>, uint64_t value);
@protocol MTLSharedEvent <MTLEvent>
- (void)notifyListener:(MTLSharedEventListener*)listener
               atValue:(uint64_t)value
                 block:(MTLSharedEventNotificationBlock)block;
@property(readwrite) uint64_t signaledValue;
@end

@protocol MTLCommandBuffer;
typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer>);

typedef NS_ENUM(NSUInteger, MTLCommandBufferStatus) {
  MTLCommandBufferStatusNotEnqueued = 0,
  MTLCommandBufferStatusEnqueued = 1,
  MTLCommandBufferStatusCommitted = 2,
  MTLCommandBufferStatusScheduled = 3,
  MTLCommandBufferStatusCompleted = 4,
  MTLCommandBufferStatusError = 5,
} API_AVAILABLE(macos(10.11), ios(8.0));

@protocol MTLCommandBuffer <NSObject>
@property(readonly) MTLCommandBufferStatus status;
@property(nullable, readonly) NSError* error;
@property(readonly) CFTimeInterval GPUStartTime API_AVAILABLE(macos(10.15), ios(10.3));
@property(readonly) CFTimeInterval GPUEndTime API_AVAILABLE(macos(10.15), ios(10.3));
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (void)commit;
- (void)waitUntilCompleted;
- (void)addCompletedHandler:(MTLCommandBufferHandler)block;
- (void)encodeSignalEvent:(id<MTLEvent>)event value:(uint64_t)value API_AVAILABLE(macos(10.14), ios(12.0));
- (void)encodeWaitForEvent:(id<MTLEvent>)event value:(uint64_t)value API_AVAILABLE(macos(10.14), ios(12.0));
@end

@protocol MTLCommandQueue <NSObject>
- (nullable id<MTLCommandBuffer>)commandBuffer;
@end

// MTLDevice.h
typedef NS_ENUM(NSInteger, MTLGPUFamily) {
  MTLGPUFamilyApple1 = 1001,
  MTLGPUFamilyApple7 = 1007,
  MTLGPUFamilyApple8 = 1008,
  MTLGPUFamilyApple9 = 1009,
} API_AVAILABLE(macos(10.15), ios(13.0));

@interface MTLArchitecture : NSObject
@property(nonnull, readonly) NSString* name;
@end

@protocol MTLDevice <NSObject>
@property(nonnull, readonly) NSString* name;
@property(nonnull, readonly) MTLArchitecture* architecture API_AVAILABLE(macos(14.0), ios(17.0));
@property(readonly) BOOL hasUnifiedMemory API_AVAILABLE(macos(10.15), ios(13.0));
@property(readonly) NSUInteger maxThreadgroupMemoryLength API_AVAILABLE(macos(10.13), ios(11.0));
@property(readonly) uint64_t recommendedMaxWorkingSetSize API_AVAILABLE(macos(10.12), macCatalyst(13.0), ios(16.0));
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily API_AVAILABLE(macos(10.15), ios(13.0));
- (nullable id<MTLLibrary>)newLibraryWithSource:(NSString*)source
                                        options:(nullable MTLCompileOptions*)options
                                          error:(__autoreleasing NSError**)error;
- (nullable id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                                      error:(__autoreleasing NSError**)error;
- (nullable id<MTLCommandQueue>)newCommandQueue;
- (nullable id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (nullable id<MTLSharedEvent>)newSharedEvent API_AVAILABLE(macos(10.14), ios(12.0));
@end

NS_ASSUME_NONNULL_END
