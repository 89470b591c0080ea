/* raw_fork.c - processes made without fork(), and a program that caps its own
 * address space, as vsftpd does for each connection: its listener makes the
 * connection's process with syscall(__NR_clone, CLONE_NEWIPC | SIGCHLD, NULL), that
 * process sets RLIMIT_AS to 200 MB and makes the one that talks to the client with
 * a clone of its own. No fork handler runs on a raw clone.
 *
 * Each way of making a process (the raw clone and clone3 system calls, libc's
 * clone with a function on a stack of its own; vfork and a CLONE_VM | CLONE_VFORK
 * clone whose child closes the listener and execs this program, as Python's
 * subprocess and multiprocessing do) is checked the same way: the parent
 * hands the child a connection whose request was sent before the child existed and
 * closes its own copy; the child answers on it, then dials the listener with a
 * socket of its own; the parent goes on with its own sockets meanwhile. Then the
 * vsftpd shape, and a limit that reads back as it was set.
 *
 * Only the parent prints; children report through their exit status. Every wait
 * has a deadline (SO_RCVTIMEO, alarm). The same output on the kernel and under the
 * LD_PRELOAD shim (crates/usnet-preload/tests). usage: raw_fork ADDR PORT
 * (raw_fork ADDR PORT FD: the exec'd child's part, on connection FD) */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "conn.h"

static struct sockaddr_in addr;
static int listener;

/* The child's part: answers "request" on `s` with "response", then dials the
 * listener with a socket of its own and says "child". 0 when all went well. */
static int child_work(int s) {
    alarm(20);
    close(listener);
    timeouts(s, 10);
    char req[7];
    if (read_n(s, req, sizeof req) != 0 || memcmp(req, "request", 7) != 0) return 20;
    if (send(s, "response", 8, 0) != 8) return 21;
    close(s);
    int own = dial_to(&addr);
    if (own < 0) return 22;
    if (send(own, "child", 5, 0) != 5) return 23;
    char b[1];
    if (recv(own, b, 1, 0) != 0) return 24; /* the parent's end of stream */
    close(own);
    return 0;
}

/* The parent's part around a child made by `make` (which returns its pid): the
 * handed connection is answered, the child's own connection arrives. */
static void handed(const char *how, pid_t (*make)(int s)) {
    char name[128];
    int c = dial_to(&addr);
    int s = accept(listener, NULL, NULL);
    snprintf(name, sizeof name, "%s: connection for the child", how);
    CHECK(name, c >= 0 && s >= 0);
    snprintf(name, sizeof name, "%s: request sent before the child exists", how);
    CHECK(name, send(c, "request", 7, 0) == 7);
    pid_t kid = make(s);
    snprintf(name, sizeof name, "%s: child made", how);
    CHECK(name, kid > 0);
    close(s);
    char resp[8];
    snprintf(name, sizeof name, "%s: the child answered on the handed connection", how);
    CHECK(name, read_n(c, resp, sizeof resp) == 0 && memcmp(resp, "response", 8) == 0);
    int own = accept(listener, NULL, NULL);
    timeouts(own, 10);
    char hello[5];
    snprintf(name, sizeof name, "%s: the child's own socket reached the listener", how);
    CHECK(name, own >= 0 && read_n(own, hello, 5) == 0 && memcmp(hello, "child", 5) == 0);
    close(own);
    snprintf(name, sizeof name, "%s: the child exited well", how);
    CHECK(name, status_of(kid) == 0);
    snprintf(name, sizeof name, "%s: end of stream after the child closed", how);
    CHECK(name, recv(c, resp, sizeof resp, 0) == 0);
    close(c);
}

static pid_t by_clone_syscall(int s) {
    pid_t pid = (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, NULL);
    if (pid == 0) _exit(child_work(s));
    return pid;
}

static pid_t by_clone3_syscall(int s) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    pid_t pid = (pid_t)syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) _exit(child_work(s));
    return pid;
}

static int handed_fd;
static char child_stack[256 * 1024] __attribute__((aligned(16)));

static int clone_fn(void *arg) {
    (void)arg;
    return child_work(handed_fd);
}

static pid_t by_libc_clone(int s) {
    handed_fd = s;
    return clone(clone_fn, child_stack + sizeof child_stack, SIGCHLD, NULL);
}

/* A child that shares this memory (vfork, clone with CLONE_VM | CLONE_VFORK) may
 * only close numbers, move them and exec: it closes the listener (the way a spawn
 * with close_fds does) and starts this program on the handed connection. */
static char exec_args[3][32];

static void close_and_exec(void) {
    close_range((unsigned)listener, (unsigned)listener, 0);
    execl("/proc/self/exe", "raw_fork", exec_args[0], exec_args[1], exec_args[2], (char *)NULL);
    _exit(127);
}

static void prepare_exec(int s) {
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
    snprintf(exec_args[0], sizeof exec_args[0], "%s", ip);
    snprintf(exec_args[1], sizeof exec_args[1], "%d", ntohs(addr.sin_port));
    snprintf(exec_args[2], sizeof exec_args[2], "%d", s);
}

static pid_t by_vfork_then_exec(int s) {
    prepare_exec(s);
    pid_t pid = vfork();
    if (pid == 0) close_and_exec();
    return pid;
}

static int vm_clone_fn(void *arg) {
    (void)arg;
    close_and_exec();
    return 127;
}

static pid_t by_vm_clone_then_exec(int s) {
    prepare_exec(s);
    return clone(vm_clone_fn, child_stack + sizeof child_stack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                 NULL);
}

/* vsftpd's shape: a child with a connection caps its address space at 200 MB, then
 * makes the process that serves it with a raw clone; that one answers and dials. */
static pid_t capped_then_clone(int s) {
    pid_t mid = (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, NULL);
    if (mid != 0) return mid;
    alarm(20);
    struct rlimit as = {200u << 20, 200u << 20};
    if (setrlimit(RLIMIT_AS, &as) != 0) _exit(40);
    /* The program's own allocations still fit under its limit. */
    void *room = malloc(64u << 20);
    if (room == NULL) _exit(41);
    memset(room, 1, 64u << 20);
    free(room);
    pid_t kid = (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, NULL);
    if (kid == 0) _exit(child_work(s));
    close(s);
    _exit(status_of(kid));
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s ADDR PORT [FD]\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    alarm(60); /* the whole run's deadline */
    addr.sin_family = AF_INET;
    addr.sin_port = htons(atoi(argv[2]));
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    if (argc == 4) {
        /* The exec'd child: the listener is closed, the connection kept. */
        listener = -1;
        return child_work(atoi(argv[3]));
    }
    listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    CHECK("bind", bind(listener, (struct sockaddr *)&addr, sizeof addr) == 0);
    CHECK("listen", listen(listener, 16) == 0);
    timeouts(listener, 10);
    /* FD_CLOEXEC set and cleared with ioctl, as Python's set_inheritable does. */
    CHECK("ioctl(FIOCLEX) sets FD_CLOEXEC",
          ioctl(listener, FIOCLEX) == 0 && (fcntl(listener, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK("ioctl(FIONCLEX) clears it",
          ioctl(listener, FIONCLEX) == 0 && (fcntl(listener, F_GETFD) & FD_CLOEXEC) == 0);

    handed("syscall(SYS_clone)", by_clone_syscall);
    handed("syscall(SYS_clone3)", by_clone3_syscall);
    handed("clone()", by_libc_clone);
    handed("RLIMIT_AS 200 MB, then a raw clone", capped_then_clone);
    handed("vfork(), close_range and exec", by_vfork_then_exec);
    handed("clone(CLONE_VM | CLONE_VFORK), close_range and exec", by_vm_clone_then_exec);

    /* The parent's sockets still work after all of that. */
    int c = dial_to(&addr);
    int s = accept(listener, NULL, NULL);
    char b[2];
    CHECK("the parent's listener and a new connection still work",
          c >= 0 && s >= 0 && send(c, "hi", 2, 0) == 2 && read_n(s, b, 2) == 0);
    close(c);
    close(s);

    /* A limit reads back as the program set it. */
    struct rlimit set = {1u << 30, RLIM_INFINITY}, got;
    CHECK("setrlimit(RLIMIT_AS, 1 GiB)", setrlimit(RLIMIT_AS, &set) == 0);
    CHECK("getrlimit gives back 1 GiB",
          getrlimit(RLIMIT_AS, &got) == 0 && got.rlim_cur == set.rlim_cur &&
              got.rlim_max == RLIM_INFINITY);
    struct rlimit old;
    CHECK("prlimit gives back 1 GiB",
          prlimit(0, RLIMIT_AS, NULL, &old) == 0 && old.rlim_cur == set.rlim_cur);
    int dialed = dial_to(&addr);
    CHECK("a new socket under the limit", dialed >= 0);
    int accepted = accept(listener, NULL, NULL);
    close(dialed);
    close(accepted);

    close(listener);
    printf("%s\n", failures ? "FAILED" : "all ok");
    return failures ? 1 : 0;
}
