// Internals of the emulated Metal (tools/metal_emu), shared by its files.
#pragma once

#import <Metal/Metal.h>
#import <MetalPerformanceShaders/MetalPerformanceShaders.h>

#include <functional>
#include <string>

namespace emu {

// A command of a command buffer, run on the emulated GPU: "" or what failed.
using Command = std::function<std::string()>;

// Appends a command to an uncommitted command buffer (an MPSCommandBuffer:
// its current one), as a blit or a compute pass would.
void encode(id<MTLCommandBuffer> buffer, Command command);

// The emulated GPU: the simulator, behind command queues.
id<MTLDevice> device();

// Torch's work on its current stream: encoded now, run when the GPU gets
// there (torch_mps.mm, built per torch runtime).
void enqueue(std::function<void()> work);

// Commits torch's current stream and waits for it.
void wait_current_stream();

// Released: its memory stays, so what still points at it can tell.
bool is_zombie(id object);

[[noreturn]] void fail(const char* what);

}  // namespace emu
