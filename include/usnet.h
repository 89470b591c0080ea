/* usnet.h - C API of usnet (libusnet.so / libusnet.a, crate usnet-ffi). */
#ifndef USNET_H
#define USNET_H

#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <poll.h>
#include <sys/epoll.h>

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

/* ===================================================================== */
/* Section: sockets on a usnet stack server (usnet_*)                    */
/*                                                                       */
/* BSD sockets whose stack is a running `usnet up` (see docs/server.md). */
/* Same arguments as the system calls; -1 and errno on failure.          */
/* Descriptors are real kernel fd numbers reserved for usnet sockets:    */
/* pass them to usnet_* calls only. usnet_poll and usnet_epoll_* take    */
/* kernel descriptors too (pipes, eventfds, kernel sockets) in one set.  */
/* Domains AF_INET/AF_INET6; SOCK_STREAM and SOCK_DGRAM, ICMP echo       */
/* (SOCK_DGRAM) and raw ICMP (SOCK_RAW) sockets, with                    */
/* SOCK_NONBLOCK/SOCK_CLOEXEC. MSG_DONTWAIT, MSG_NOSIGNAL, MSG_WAITALL;  */
/* MSG_PEEK and control messages give EOPNOTSUPP. A write to a stream    */
/* whose peer is gone raises SIGPIPE unless MSG_NOSIGNAL, as the kernel. */
/* ===================================================================== */

/* Attach to the stack server `stack` (NULL: $USNET_STACK or the only one */
/* running). Optional: the first call attaches by itself.                 */
int usnet_attach(const char *stack);
/* 1 if fd is a usnet socket or usnet epoll set of this process. */
int usnet_is_socket(int fd);

int usnet_socket(int domain, int type, int protocol);
int usnet_bind(int fd, const struct sockaddr *addr, socklen_t len);
int usnet_listen(int fd, int backlog);
int usnet_accept(int fd, struct sockaddr *addr, socklen_t *len);
int usnet_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
/* Blocking: waits for the handshake (SO_SNDTIMEO bounds it). Non-blocking: */
/* EINPROGRESS, then poll for POLLOUT and read SO_ERROR.                    */
int usnet_connect(int fd, const struct sockaddr *addr, socklen_t len);

ssize_t usnet_send(int fd, const void *buf, size_t len, int flags);
ssize_t usnet_sendto(int fd, const void *buf, size_t len, int flags,
                     const struct sockaddr *to, socklen_t tolen);
ssize_t usnet_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t usnet_write(int fd, const void *buf, size_t len);
ssize_t usnet_writev(int fd, const struct iovec *iov, int iovcnt);
ssize_t usnet_recv(int fd, void *buf, size_t len, int flags);
ssize_t usnet_recvfrom(int fd, void *buf, size_t len, int flags,
                       struct sockaddr *from, socklen_t *fromlen);
ssize_t usnet_recvmsg(int fd, struct msghdr *msg, int flags);
ssize_t usnet_read(int fd, void *buf, size_t len);
ssize_t usnet_readv(int fd, const struct iovec *iov, int iovcnt);
/* sendfile(2): the file's bytes go straight into the socket's send ring (no   */
/* buffer between); *off moves if given, else the file's position does.        */
ssize_t usnet_sendfile(int out_fd, int in_fd, off_t *off, size_t count);

int usnet_shutdown(int fd, int how);
int usnet_close(int fd);
/* A new number for the same socket (flags and options shared, FD_CLOEXEC per
 * number); the socket closes when its last number does. */
int usnet_dup(int fd);
int usnet_dup2(int oldfd, int newfd);
int usnet_dup3(int oldfd, int newfd, int flags);

/* SOL_SOCKET: SO_REUSEADDR, SO_REUSEPORT, SO_KEEPALIVE, SO_RCVBUF, SO_SNDBUF,  */
/* SO_RCVTIMEO, SO_SNDTIMEO, SO_LINGER; get also SO_ERROR, SO_TYPE, SO_DOMAIN,  */
/* SO_PROTOCOL, SO_ACCEPTCONN. IPPROTO_TCP: TCP_NODELAY; get also TCP_INFO      */
/* (struct tcp_info). USNET_SOL_USNET: USNET_RX_PRIORITY. Others: ENOPROTOOPT.  */
int usnet_setsockopt(int fd, int level, int name, const void *val, socklen_t len);
/* usnet's own options (level USNET_SOL_USNET). USNET_RX_PRIORITY: priority-aware
 * receive (docs/priority.md), an int priority on the scale of -nice for a bound UDP
 * socket or a listener (EINVAL before); USNET_RX_PRIORITY_NONE takes the mark back. Above the process's own
 * priority it needs CAP_SYS_NICE or RLIMIT_NICE (EPERM). */
#define USNET_SOL_USNET         0x7573
#define USNET_RX_PRIORITY       1
#define USNET_RX_PRIORITY_NONE  (-2147483647 - 1)
int usnet_getsockopt(int fd, int level, int name, void *val, socklen_t *len);
int usnet_getsockname(int fd, struct sockaddr *addr, socklen_t *len);
int usnet_getpeername(int fd, struct sockaddr *addr, socklen_t *len);

/* F_GETFL, F_SETFL (O_NONBLOCK, O_ASYNC), F_GETFD, F_SETFD, F_DUPFD,
 * F_DUPFD_CLOEXEC, F_GETOWN, F_SETOWN, F_GETSIG, F_SETSIG (signal-driven I/O:
 * docs/preload.md). */
int usnet_fcntl(int fd, int cmd, long arg);
/* FIONBIO (*arg: the mode), FIONREAD (*arg := bytes readable, streams), SIOCATMARK
 * (int *arg), FIOASYNC (*arg: O_ASYNC on or off), FIOSETOWN and SIOCSPGRP (*arg:
 * the owner), FIOGETOWN and SIOCGPGRP (*arg := the owner); the interface queries
 * SIOCGIF* (struct ifreq or ifconf *arg): the stack's interface answered from the
 * stack, any other by the kernel. */
int usnet_ioctl(int fd, unsigned long req, void *arg);

/* The interfaces a program on the stack sees: the kernel's loopback and the
 * stack's one interface (named after its TAP, AF_PACKET or AF_XDP device, else
 * usnet0), with its addresses, MAC and MTU. The kernel's without a stack.
 * freeifaddrs(3) and if_freenameindex(3) release what these return. */
struct ifaddrs;
struct if_nameindex;
int usnet_getifaddrs(struct ifaddrs **out);
unsigned usnet_if_nametoindex(const char *name);
char *usnet_if_indextoname(unsigned index, char *buf);
struct if_nameindex *usnet_if_nameindex(void);

/* Any mix of usnet sockets and kernel descriptors. */
int usnet_poll(struct pollfd *fds, nfds_t n, int timeout_ms);
/* An epoll set (a real kernel epoll fd); EPOLLIN/OUT/RDHUP/HUP/ERR, EPOLLET,  */
/* EPOLLONESHOT for usnet sockets; kernel descriptors are added as they are.   */
int usnet_epoll_create(int size);
int usnet_epoll_create1(int flags);
int usnet_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);
int usnet_epoll_wait(int epfd, struct epoll_event *out, int max, int timeout_ms);

/* ===================================================================== */
/* End of section: sockets                                               */
/* ===================================================================== */

#ifdef __cplusplus
}
#endif

#endif /* USNET_H */
