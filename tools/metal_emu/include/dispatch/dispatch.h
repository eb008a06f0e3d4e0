// The emulation's libdispatch (tools/metal_emu): serial queues, which is all
// torch's MPSStream uses. dispatch_sync runs the block on the calling thread
// while it owns the queue; a dispatch_sync onto a queue the thread already
// owns aborts, as libdispatch's does ("dispatch_sync called on queue already
// owned by current thread").
#pragma once

typedef struct emu_dispatch_queue* dispatch_queue_t;
typedef struct emu_dispatch_queue_attr* dispatch_queue_attr_t;
typedef void (^dispatch_block_t)(void);
#define DISPATCH_QUEUE_SERIAL ((dispatch_queue_attr_t)0)

dispatch_queue_t dispatch_queue_create(const char* label, dispatch_queue_attr_t attr);
void dispatch_sync(dispatch_queue_t queue, dispatch_block_t block);
void dispatch_release(dispatch_queue_t queue);
