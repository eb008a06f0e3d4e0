// Stand-in for Apple's MetalPerformanceShaders framework header, for
// tools/check_macos.py only: the one class torch's MPS headers name, as the
// macOS SDK declares it.
#pragma once

#import <Metal/Metal.h>

@interface MPSCommandBuffer : NSObject <MTLCommandBuffer>
@end
