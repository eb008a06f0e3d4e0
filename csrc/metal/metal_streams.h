// mps_ext's streams and events on Metal (Objective-C++ only). Per torch version:
// - 2.14 and 2.15: torch's streams (its pool of 32 and its per-thread current
//   stream), so torch's ops follow the current stream as mps_ext's kernels do.
// - 2.13: torch has one stream. mps_ext's others are at::mps::MPSStream objects
//   of its own (each with its own command queue and serial queue), a pool of
//   32 made on first use; the current stream is per thread, here, and only
//   mps_ext's kernels follow it.
// Events are MTLSharedEvents signalled and waited for on the streams' command
// buffers (torch's MPSEvent refuses non-default streams up to 2.15).
#pragma once

#include <ATen/mps/MPSStream.h>

#include <memory>
#include <vector>

#include "backend.h"

namespace mps_ext::metal_streams {

// The calling thread's current stream, where launches are encoded.
at::mps::MPSStream* current();
int64_t current_id();
void set_current(int64_t stream_id);
int64_t new_stream();
void synchronize(int64_t stream_id);
bool query(int64_t stream_id);
std::unique_ptr<Event> new_event(id<MTLDevice> device);
void record_tensor(const at::Tensor& t, int64_t stream_id);
void wait_torch_event(int64_t stream_id, int64_t event_id);
void before_torch_ops();

// Inside a block on stream->queue(), before encoding a kernel: the stream's
// waits gate the command buffer it goes into, whose completion and failure
// the stream will report.
void before_encoding(at::mps::MPSStream* stream);
// Before encoding on `stream`, outside its queue: where torch's ops stay on
// the default stream while mps_ext's kernels go to another (torch 2.13), the
// kernels wait for the torch work enqueued so far, which they may consume.
void after_torch_work(at::mps::MPSStream* stream);

// Inside a block on stream->queue(), after encoding work that uses `tensors`
// on a non-default stream: they live until the command buffer has completed.
void keep_until_completed(at::mps::MPSStream* stream, std::vector<at::Tensor> tensors);
// Frees what completed command buffers let go of (on the calling thread, not
// Metal's: freeing an MPS tensor enters torch's allocator).
void free_released();

}  // namespace mps_ext::metal_streams
