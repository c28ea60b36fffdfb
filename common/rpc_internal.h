/*
 * rpc_internal — declarations shared by rpc.c, rpc_server.c and rpc_client.c only.
 * Not for use outside the rpc module.
 */
#ifndef TSR_RPC_INTERNAL_H
#define TSR_RPC_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "error.h"

/* Reads a whole (small) text file, NUL-terminated; caller frees. NULL with err set
 * (TSR_EIO; TSR_ELIMIT above 1 MiB). `what` names the option in the message. */
char *tsr__rpc_read_file(const char *path, const char *what, tsr_error *err);

/* Copies a slice into a new NUL-terminated string (caller frees); never NULL. */
char *tsr__rpc_slice_strdup(grpc_slice s);

/* Reads a received byte buffer (possibly many slices or compressed) into one slice
 * (caller unrefs). */
grpc_slice tsr__rpc_buffer_to_slice(grpc_byte_buffer *bb);

/* Milliseconds from now to deadline d (any clock); INT64_MAX for an infinite deadline. */
int64_t tsr__rpc_remaining_ms(gpr_timespec d);

/* Deadline timeout_ms from now on the monotonic clock (<= 0 → 30000). */
gpr_timespec tsr__rpc_deadline(int64_t timeout_ms);

/* ThreadSanitizer cannot see the synchronization inside gRPC core (not instrumented):
 * a call context handed to core on one thread and delivered by the completion queue on
 * another looks like a race. These annotate the hand-over (release before giving a tag
 * to core, acquire when its event arrives); no-ops in other builds. */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TSR_TSAN_RELEASE(p) __tsan_release((void *)(p))
#define TSR_TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define TSR_TSAN_RELEASE(p) ((void)0)
#define TSR_TSAN_ACQUIRE(p) ((void)0)
#endif

#endif
