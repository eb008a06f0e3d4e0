// Stand-in for Apple's MetalPerformanceShaders framework header, for
// tools/check_macos.py and the emulated Metal (tools/metal_emu): the one class
// torch's MPS headers name, as the macOS SDK declares it.
#pragma once

#import <Metal/Metal.h>

NS_ASSUME_NONNULL_BEGIN

// A command buffer that commitAndContinue replaces with a new underlying one.
@interface MPSCommandBuffer : NSObject <MTLCommandBuffer>
+ (instancetype)commandBufferFromCommandQueue:(id<MTLCommandQueue>)commandQueue;
@property(readonly, retain) id<MTLCommandBuffer> commandBuffer;
@property(readonly, retain) id<MTLCommandBuffer> rootCommandBuffer;
- (void)commitAndContinue;
@end

NS_ASSUME_NONNULL_END
