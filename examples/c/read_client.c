/* read_client - the source document's receiver: connects, reads with buffers of the
 * given size until the sender closes, and reports the throughput.
 *
 *   read_client ADDR PORT SIZE
 *
 * Prints "read_client stack=S bytes=N seconds=T mbit_s=R". Build against the kernel,
 * or with -DUSE_USNET against libusnet (see usnet_or_kernel.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "usnet_or_kernel.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s ADDR PORT SIZE\n", argv[0]);
        return 2;
    }
    size_t size = strtoul(argv[3], NULL, 10);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    if (size == 0 || inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
        fprintf(stderr, "read_client: bad address or size\n");
        return 2;
    }
    int s = -1;
    /* The server may be a moment late: retry refusals for up to 10 s. */
    for (int tries = 0; tries < 1000; tries++) {
        s = S_SOCKET(AF_INET, SOCK_STREAM, 0);
        if (s < 0) {
            fprintf(stderr, "read_client: socket: %s\n", strerror(errno));
            return 1;
        }
        if (S_CONNECT(s, (struct sockaddr *)&a, sizeof a) == 0) break;
        int e = errno;
        S_CLOSE(s);
        s = -1;
        if (e != ECONNREFUSED) {
            fprintf(stderr, "read_client: connect: %s\n", strerror(e));
            return 1;
        }
        struct timespec ten_ms = {0, 10 * 1000 * 1000};
        nanosleep(&ten_ms, NULL);
    }
    if (s < 0) {
        fprintf(stderr, "read_client: nobody listens\n");
        return 1;
    }
    /* A deadline on every read: a lost peer fails the run instead of hanging it. */
    struct timeval tv = {.tv_sec = 30};
    S_SETSOCKOPT(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char *buf = malloc(size);
    unsigned long long total = 0;
    double t0 = 0;
    for (;;) {
        ssize_t n = S_READ(s, buf, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "read_client: read: %s\n", strerror(errno));
            return 1;
        }
        if (n == 0) break;
        if (total == 0) t0 = now();
        total += (unsigned long long)n;
    }
    double secs = total ? now() - t0 : 0;
    S_CLOSE(s);
    printf("read_client stack=%s bytes=%llu seconds=%.3f mbit_s=%.1f\n", S_STACK, total, secs,
           secs > 0 ? total * 8 / secs / 1e6 : 0.0);
    free(buf);
    return 0;
}
