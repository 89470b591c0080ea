/* raw_syscalls.c - what a program that asks the kernel itself sees of its sockets:
 * fstat and a raw statx call (libuv's uv_guess_handle) say "socket", and a raw
 * getsockopt gives the type; close, dup, dup3 and fcntl made through
 * syscall(2) (libuv closes every descriptor with syscall(SYS_close)) act on the
 * socket as their libc functions do, and a number closed that way is free for the
 * next socket and for a file. The same output on the kernel and under the LD_PRELOAD
 * shim (crates/usnet-preload/tests). usage: raw_syscalls ADDR PORT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"

static int raw_sockopt(int fd, int opt) {
    int v = -1;
    socklen_t len = sizeof v;
    if (syscall(SYS_getsockopt, fd, SOL_SOCKET, opt, &v, &len) != 0)
        return -1;
    return v;
}

/* One byte each way on a connection's two ends. */
static int talks(int a, int b) {
    char c = 0;
    return send(a, "x", 1, 0) == 1 && recv(b, &c, 1, 0) == 1 && c == 'x' &&
           send(b, "y", 1, 0) == 1 && recv(a, &c, 1, 0) == 1 && c == 'y';
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    alarm(30);
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);

    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    CHECK("bind", bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK("listen", listen(l, 8) == 0);

    struct stat st;
    CHECK("fstat says socket", fstat(l, &st) == 0 && S_ISSOCK(st.st_mode));
    struct statx sx;
    CHECK("raw statx says socket",
          syscall(SYS_statx, l, "", AT_EMPTY_PATH, STATX_TYPE, &sx) == 0 &&
              S_ISSOCK(sx.stx_mode));
    CHECK("raw SO_TYPE", raw_sockopt(l, SO_TYPE) == SOCK_STREAM);
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK("raw SO_TYPE of a UDP socket", raw_sockopt(u, SO_TYPE) == SOCK_DGRAM);
    CHECK("raw close of a UDP socket", syscall(SYS_close, u) == 0);
    CHECK("its number is free", fcntl(u, F_GETFD) < 0 && errno == EBADF);

    int c1 = socket(AF_INET, SOCK_STREAM, 0);
    CHECK("connect 1", connect(c1, (struct sockaddr *)&a, sizeof a) == 0);
    int s1 = accept(l, NULL, NULL);
    CHECK("accept 1", s1 >= 0 && talks(c1, s1));

    /* A connection closed with a raw close ends at the peer, and its number is the
     * kernel's to give again. */
    CHECK("raw close of a connection", syscall(SYS_close, s1) == 0);
    char b;
    CHECK("the peer sees the end", recv(c1, &b, 1, 0) == 0);
    CHECK("a raw close of a closed number is EBADF",
          syscall(SYS_close, s1) < 0 && errno == EBADF);
    close(c1);

    int c2 = socket(AF_INET, SOCK_STREAM, 0);
    CHECK("connect 2", connect(c2, (struct sockaddr *)&a, sizeof a) == 0);
    int s2 = accept(l, NULL, NULL);
    CHECK("accept 2 takes the lowest free number", s2 == s1);
    CHECK("the new connection talks", talks(c2, s2));
    /* A file opened now takes another number: the socket still holds its own. */
    int f = open("/dev/null", O_RDONLY);
    CHECK("a file gets another number", f >= 0 && f != s2);
    CHECK("the connection still talks", talks(c2, s2));
    close(f);

    /* dup, fcntl and dup3 through syscall(2). */
    int d = syscall(SYS_dup, s2);
    CHECK("raw dup", d >= 0 && d != s2);
    CHECK("raw F_SETFD", syscall(SYS_fcntl, d, F_SETFD, FD_CLOEXEC) == 0);
    CHECK("raw F_GETFD", syscall(SYS_fcntl, d, F_GETFD) == FD_CLOEXEC);
    CHECK("the original keeps its own flag", fcntl(s2, F_GETFD) == 0);
    int high = 200;
    CHECK("raw dup3", syscall(SYS_dup3, s2, high, 0) == high);
    CHECK("raw close of the original", syscall(SYS_close, s2) == 0);
    CHECK("the dup talks", talks(c2, d));
    CHECK("the dup3 talks", talks(c2, high));
    syscall(SYS_close, d);
    CHECK("still open under one number", talks(c2, high));
    syscall(SYS_close, high);
    CHECK("the last raw close ends the connection", recv(c2, &b, 1, 0) == 0);
    close(c2);
    close(l);

    if (failures == 0)
        printf("all ok\n");
    return failures != 0;
}
