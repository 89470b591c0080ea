/* usnet.h - C API of usnet (libusnet.so / libusnet.a, crate usnet-ffi). */
#ifndef USNET_H
#define USNET_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ===================================================================== */
/* Section: asynchronous system calls (usnet_async_*)                    */
/*                                                                       */
/* A shared-memory request ring plus N exec threads that run arbitrary   */
/* system calls for the caller (see docs/async-syscall.md).              */
/* Conventions: functions return 0 or a count on success and a negative  */
/* errno on failure. Results of carried calls follow syscall(2) with     */
/* negative errno (e.g. -EBADF). Refused calls (clone, fork, exit,       */
/* rt_sigreturn, arch_prctl, ...) complete with -ENOSYS. Thread-specific */
/* calls act on an exec thread (gettid returns the exec thread's id).    */
/* Pointer arguments must stay valid until the completion is reaped.     */
/* ===================================================================== */

typedef struct UsnetAsync usnet_async_t;

typedef struct usnet_async_call {
    int64_t num;        /* system call number (SYS_xxx) */
    uint64_t args[6];   /* unused arguments: 0 */
    uint64_t user_data; /* returned with the completion */
} usnet_async_call_t;

typedef struct usnet_async_completion {
    uint64_t user_data;
    int64_t result;     /* >= 0 result, or -errno; -ECANCELED if cancelled by exit */
} usnet_async_completion_t;

typedef struct usnet_async_errors {
    uint64_t bad_index, bad_state, unknown_state, bad_completion, queue_corrupt;
} usnet_async_errors_t;

#define USNET_ASYNC_EXIT_DRAIN  0 /* exec threads run queued calls, then stop */
#define USNET_ASYNC_EXIT_CANCEL 1 /* queued calls complete with -ECANCELED */

/* init: ring of nentries (power of two, <= 65536) entries and nexec >= 1
 * exec threads. NULL with errno set on failure. */
usnet_async_t *usnet_async_init(uint32_t nexec, uint32_t nentries);

/* Queue one call; args may be NULL (all zero). 0, -EAGAIN (no free entry),
 * -ESHUTDOWN (exiting), -EINVAL. */
int32_t usnet_async_submit(usnet_async_t *h, int64_t num, const uint64_t *args, uint64_t user_data);

/* Queue n calls with one submission; returns the number queued (a prefix)
 * or a negative errno if none. */
int32_t usnet_async_submit_batch(usnet_async_t *h, const usnet_async_call_t *calls, uint32_t n);

/* wakeup: wake exec threads, wait until at least one call has completed,
 * store up to max completions in out. Returns the count, -ENOENT if
 * nothing is in flight, -EPIPE after exit with nothing left. */
int32_t usnet_async_wakeup(usnet_async_t *h, usnet_async_completion_t *out, uint32_t max);

/* Wait for one completion; timeout_ns < 0 waits forever. 0, -ETIMEDOUT,
 * -ENOENT, -EPIPE. */
int32_t usnet_async_wait_one(usnet_async_t *h, usnet_async_completion_t *out, int64_t timeout_ns);

/* Completion polling: store up to max available completions; returns the
 * count (0 if none). Never blocks. */
int32_t usnet_async_poll(usnet_async_t *h, usnet_async_completion_t *out, uint32_t max);

/* Calls submitted and not yet reaped. */
int32_t usnet_async_in_flight(usnet_async_t *h);

/* Protocol violations counted (peer wrote garbage into the shared area). */
int32_t usnet_async_errors(usnet_async_t *h, usnet_async_errors_t *out);

/* exit: stop and join the exec threads (a call blocked in the kernel delays
 * this until it returns). Every submitted call then has a completion to
 * reap; new submits fail with -ESHUTDOWN. Returns the number cancelled. */
int64_t usnet_async_exit(usnet_async_t *h, int32_t mode);

/* Exit (cancel) if needed and free h. NULL is a no-op. */
void usnet_async_destroy(usnet_async_t *h);

/* ===================================================================== */
/* End of section: asynchronous system calls                             */
/* ===================================================================== */

#ifdef __cplusplus
}
#endif

#endif /* USNET_H */
