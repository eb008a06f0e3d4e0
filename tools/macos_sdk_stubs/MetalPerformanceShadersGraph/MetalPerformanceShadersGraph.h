// Stand-in for Apple's MetalPerformanceShadersGraph framework header, for
// tools/check_macos.py only: the classes torch's MPS headers name, with the
// macOS SDK's class hierarchy.
#pragma once

#import <MetalPerformanceShaders/MetalPerformanceShaders.h>

@interface MPSGraphObject : NSObject
@end

@interface MPSGraph : MPSGraphObject
@end

@interface MPSGraphExecutionDescriptor : MPSGraphObject
@end

@interface MPSGraphCompilationDescriptor : MPSGraphObject
@end
