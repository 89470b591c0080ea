/* tcp_ttl.c - a TCP socket's TTL and minimum TTL (RFC 5082, the Generalized TTL
 * Security Mechanism that BGP speakers use): IP_TTL 255 on the sender, IP_MINTTL
 * 255 on the receiver, so only a peer one hop away gets through. IP_TTL set before
 * connect goes on the SYN; IP_MINTTL set before or after listen drops SYNs below
 * it and is inherited by accepted connections, which drop segments below it; a
 * segment dropped that way is sent again with the TTL the socket has then.
 *
 * Usage: tcp_ttl ADDR PORT (uses PORT and PORT+1). Prints the same on the kernel
 * (over loopback) and under the shim; ends with "all ok". */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static int opt(int s, int name) {
    int v = -2;
    socklen_t l = sizeof v;
    getsockopt(s, IPPROTO_IP, name, &v, &l);
    return v;
}

static int set(int s, int name, int v) {
    return setsockopt(s, IPPROTO_IP, name, &v, sizeof v);
}

static int listener(struct sockaddr_in *at, int minttl_before, int minttl_after) {
    int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (minttl_before)
        set(l, IP_MINTTL, minttl_before);
    if (bind(l, (struct sockaddr *)at, sizeof *at) != 0 || listen(l, 4) != 0)
        return -1;
    if (minttl_after)
        set(l, IP_MINTTL, minttl_after);
    return l;
}

/* A non-blocking connect from a socket with TTL `ttl` (0: the default): whether
 * it completes within `ms`. The socket is returned in *out. */
static int connects(struct sockaddr_in *to, int ttl, int ms, int *out) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    *out = c;
    if (ttl)
        set(c, IP_TTL, ttl);
    fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
    if (connect(c, (struct sockaddr *)to, sizeof *to) == 0)
        return 1;
    if (errno != EINPROGRESS)
        return 0;
    struct pollfd p = {.fd = c, .events = POLLOUT};
    if (poll(&p, 1, ms) != 1)
        return 0;
    int err = -1;
    socklen_t l = sizeof err;
    getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &l);
    return err == 0;
}

static int readable(int s, int ms) {
    struct pollfd p = {.fd = s, .events = POLLIN};
    return poll(&p, 1, ms) == 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tcp_ttl ADDR PORT\n");
        return 2;
    }
    int port = atoi(argv[2]);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, argv[1], &at.sin_addr) != 1)
        return 2;
    struct sockaddr_in at2 = at;
    at2.sin_port = htons(port + 1);

    int f = socket(AF_INET, SOCK_STREAM, 0);
    CHECK("a fresh socket: TTL 64, no minimum", opt(f, IP_TTL) == 64 && opt(f, IP_MINTTL) == 0);
    CHECK("IP_MINTTL 256: EINVAL", set(f, IP_MINTTL, 256) == -1 && errno == EINVAL);
    CHECK("IP_MINTTL -1: EINVAL", set(f, IP_MINTTL, -1) == -1 && errno == EINVAL);
    CHECK("IP_MINTTL 255 reads back", set(f, IP_MINTTL, 255) == 0 && opt(f, IP_MINTTL) == 255);
    close(f);

    int l = listener(&at, 255, 0);
    CHECK("a listener with IP_MINTTL 255 set before listen", l >= 0);

    int c1;
    CHECK("a SYN with TTL 64 is dropped: no connection", !connects(&at, 0, 300, &c1));
    int nb = fcntl(l, F_GETFL);
    fcntl(l, F_SETFL, nb | O_NONBLOCK);
    CHECK("and nothing to accept", accept(l, NULL, NULL) == -1 && errno == EAGAIN);
    fcntl(l, F_SETFL, nb);
    close(c1);

    int c2;
    CHECK("a SYN with TTL 255 connects", connects(&at, 255, 5000, &c2));
    CHECK("IP_TTL reads 255", opt(c2, IP_TTL) == 255);
    int a = accept(l, NULL, NULL);
    CHECK("accepted", a >= 0);
    CHECK("the accepted socket inherited IP_MINTTL 255", opt(a, IP_MINTTL) == 255);
    char b[8];
    CHECK("a byte sent with TTL 255 arrives",
          send(c2, "1", 1, 0) == 1 && readable(a, 5000) && recv(a, b, sizeof b, 0) == 1);

    /* One hop further: dropped by the connection, and by each retransmission
     * while the TTL stays 254. */
    CHECK("IP_TTL 254 on the connection", set(c2, IP_TTL, 254) == 0);
    CHECK("a byte sent with TTL 254 does not arrive",
          send(c2, "2", 1, 0) == 1 && !readable(a, 300));
    CHECK("IP_TTL 255 again", set(c2, IP_TTL, 255) == 0);
    CHECK("its retransmission does",
          readable(a, 10000) && recv(a, b, sizeof b, 0) == 1 && b[0] == '2');

    /* The minimum set after listen. */
    int l2 = listener(&at2, 0, 255);
    CHECK("a listener with IP_MINTTL 255 set after listen", l2 >= 0);
    int c3, c4;
    CHECK("there too a SYN with TTL 64 is dropped", !connects(&at2, 0, 300, &c3));
    CHECK("and one with TTL 255 connects", connects(&at2, 255, 5000, &c4));

    close(c2);
    close(c3);
    close(c4);
    close(a);
    close(l);
    close(l2);
    if (failures == 0)
        printf("all ok\n");
    return failures ? 1 : 0;
}
