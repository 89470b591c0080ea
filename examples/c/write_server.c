/* write_server - the source document's sender: accepts one connection and keeps
 * writing a buffer of the given size to it for the given time, then closes.
 *
 *   write_server ADDR PORT SIZE SECONDS
 *
 * Prints "write_server stack=S bytes=N seconds=T". Build against the kernel, or with
 * -DUSE_USNET against libusnet (see usnet_or_kernel.h). */
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
    if (argc != 5) {
        fprintf(stderr, "usage: %s ADDR PORT SIZE SECONDS\n", argv[0]);
        return 2;
    }
    size_t size = strtoul(argv[3], NULL, 10);
    double seconds = atof(argv[4]);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    if (size == 0 || inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
        fprintf(stderr, "write_server: bad address or size\n");
        return 2;
    }
    int l = S_SOCKET(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (l < 0 || S_SETSOCKOPT(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        S_BIND(l, (struct sockaddr *)&a, sizeof a) < 0 || S_LISTEN(l, 16) < 0) {
        fprintf(stderr, "write_server: listen: %s\n", strerror(errno));
        return 1;
    }
    printf("write_server listening\n");
    fflush(stdout);
    int c = S_ACCEPT(l, NULL, NULL);
    if (c < 0) {
        fprintf(stderr, "write_server: accept: %s\n", strerror(errno));
        return 1;
    }
    char *buf = malloc(size);
    memset(buf, 'u', size);
    unsigned long long total = 0;
    double t0 = now(), end = t0 + seconds;
    while (now() < end) {
        size_t off = 0;
        while (off < size) {
            ssize_t n = S_WRITE(c, buf + off, size - off);
            if (n < 0) {
                if (errno == EINTR) continue;
                fprintf(stderr, "write_server: write: %s\n", strerror(errno));
                return 1;
            }
            off += (size_t)n;
        }
        total += size;
    }
    S_SHUTDOWN(c, SHUT_WR);
    /* Wait for the reader's end of stream so the close cuts nothing. */
    char b[64];
    while (S_READ(c, b, sizeof b) > 0) {
    }
    S_CLOSE(c);
    S_CLOSE(l);
    printf("write_server stack=%s bytes=%llu seconds=%.3f\n", S_STACK, total, now() - t0);
    free(buf);
    return 0;
}
