/* conn.h - the test programs' connection helpers, each wait with a deadline:
 * timeouts on a socket, an exact read, a dial, a child's exit status. */
#ifndef USNET_CONN_H
#define USNET_CONN_H

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

/* SO_RCVTIMEO and SO_SNDTIMEO of `secs` seconds. */
static inline void timeouts(int fd, int secs) {
    struct timeval tv = {secs, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* Reads exactly n bytes from a socket (or fails). */
static inline int read_n(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, buf + got, n - got, 0);
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

/* A TCP connection to `a`, with 10 s timeouts; -1 if it failed. */
static inline int dial_to(const struct sockaddr_in *a) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    timeouts(c, 10);
    if (connect(c, (const struct sockaddr *)a, sizeof *a) != 0) {
        close(c);
        return -1;
    }
    return c;
}

/* The exit status of child `pid` (-1 if it did not exit by itself). */
static inline int status_of(pid_t pid) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

#endif
