/* An ICMP echo ("ping") socket, socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP), as
 * ping, fping's and Go's unprivileged modes, and monitoring agents use it: the
 * program writes an echo request (type, code, its sequence number and data);
 * the stack sets the identifier (the socket's port) and the checksum; the
 * whole echo reply comes back from port 0, with its TTL on request. The same
 * answers under the shim as on the kernel (there with ping_group_range letting
 * the caller's group in).
 *
 *   ping_socket ADDR PORT      (ADDR: an IPv4 address that answers echoes)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip_icmp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "inet_checksum.h"

static const char DATA[] = "usnet echo data";

/* An echo request with sequence number `seq` and an identifier and checksum
 * the stack must replace. Returns its length. */
static size_t request(unsigned char *m, int seq) {
    struct icmphdr h = {.type = ICMP_ECHO, .code = 0};
    h.checksum = 0xbeef;
    h.un.echo.id = htons(0x1234);
    h.un.echo.sequence = htons(seq);
    memcpy(m, &h, sizeof h);
    memcpy(m + sizeof h, DATA, sizeof DATA);
    return sizeof h + sizeof DATA;
}

/* Receives one message on `s` within 5 s and checks it is the echo reply to
 * request `seq` under identifier `ident`, from `peer`, with `ttl`'s TTL (-1: not
 * asked for). */
static void reply(const char *what, int s, int ident, int seq, const struct sockaddr_in *peer,
                  int want_ttl) {
    unsigned char m[256];
    union {
        char buf[128];
        struct cmsghdr align;
    } control;
    struct sockaddr_in from;
    memset(&from, 0, sizeof from);
    struct iovec v = {.iov_base = m, .iov_len = sizeof m};
    struct msghdr msg = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &v,
                         .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct pollfd p = {.fd = s, .events = POLLIN};
    ssize_t n = poll(&p, 1, 5000) == 1 ? recvmsg(s, &msg, 0) : -1;
    char name[160];
    snprintf(name, sizeof name, "%s: the whole echo message comes back", what);
    CHECK(name, n == (ssize_t)(sizeof(struct icmphdr) + sizeof DATA));
    if (n < (ssize_t)sizeof(struct icmphdr))
        return;
    struct icmphdr h;
    memcpy(&h, m, sizeof h);
    snprintf(name, sizeof name, "%s: an echo reply, code 0", what);
    CHECK(name, h.type == ICMP_ECHOREPLY && h.code == 0);
    snprintf(name, sizeof name, "%s: under the socket's identifier, with its sequence number",
             what);
    CHECK(name, ntohs(h.un.echo.id) == ident && ntohs(h.un.echo.sequence) == seq);
    snprintf(name, sizeof name, "%s: its checksum right, its data the request's", what);
    CHECK(name, checksum(m, n) == 0 && memcmp(m + sizeof h, DATA, sizeof DATA) == 0);
    snprintf(name, sizeof name, "%s: from the peer, port 0", what);
    CHECK(name, from.sin_family == AF_INET && from.sin_addr.s_addr == peer->sin_addr.s_addr &&
                    from.sin_port == 0);
    int ttl = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL)
            memcpy(&ttl, CMSG_DATA(c), sizeof ttl);
    snprintf(name, sizeof name, "%s: its TTL as asked for", what);
    CHECK(name, ttl == want_ttl);
}

static int port_of(int s) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(s, (struct sockaddr *)&a, &len) != 0)
        return -1;
    return ntohs(a.sin_port);
}

static ssize_t send_to(int s, const void *m, size_t n, const struct sockaddr_in *to) {
    return sendto(s, m, n, 0, (const struct sockaddr *)to, sizeof *to);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    struct sockaddr_in peer = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, argv[1], &peer.sin_addr) != 1)
        return 2;
    int ident = atoi(argv[2]);

    int s = socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP);
    CHECK("socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)", s >= 0);
    int v = -1;
    socklen_t len = sizeof v;
    CHECK("SO_TYPE: SOCK_DGRAM",
          getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &len) == 0 && v == SOCK_DGRAM);
    CHECK("SO_PROTOCOL: IPPROTO_ICMP",
          getsockopt(s, SOL_SOCKET, SO_PROTOCOL, &v, &len) == 0 && v == IPPROTO_ICMP);
    CHECK("no identifier before the first send", port_of(s) == 0);

    /* Only an echo request with code 0, its header whole. */
    unsigned char m[256];
    size_t n = request(m, 1);
    m[0] = ICMP_ECHOREPLY;
    CHECK("an echo reply: EINVAL", send_to(s, m, n, &peer) == -1 && errno == EINVAL);
    m[0] = ICMP_ECHO;
    m[1] = 1;
    CHECK("code 1: EINVAL", send_to(s, m, n, &peer) == -1 && errno == EINVAL);
    m[1] = 0;
    CHECK("half a header: EINVAL", send_to(s, m, 4, &peer) == -1 && errno == EINVAL);

    /* An unbound socket gets an identifier at its first send. The destination's
     * port is not the echo's: ignored. */
    peer.sin_port = htons(9);
    CHECK("an echo request is sent", send_to(s, m, n, &peer) == (ssize_t)n);
    int first = port_of(s);
    CHECK("the socket has an identifier after it", first > 0);
    reply("the first", s, first, 1, &peer, -1);

    /* A bound identifier. Linux makes ping sockets with SO_REUSEADDR on: another
     * socket may bind it too (the replies go to the one bound last). */
    int b = socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP);
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(ident)};
    CHECK("bind to an identifier", bind(b, (struct sockaddr *)&any, sizeof any) == 0);
    CHECK("getsockname names it", port_of(b) == ident);
    int c = socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP);
    CHECK("another socket binds the same identifier", bind(c, (struct sockaddr *)&any, sizeof any) == 0);
    CHECK("a bound socket binds no more",
          bind(c, (struct sockaddr *)&any, sizeof any) == -1 && errno == EINVAL);
    close(c);

    /* Connected, with the TTL of each reply asked for. */
    int on = 1;
    CHECK("IP_RECVTTL", setsockopt(b, IPPROTO_IP, IP_RECVTTL, &on, sizeof on) == 0);
    CHECK("connect", connect(b, (struct sockaddr *)&peer, sizeof peer) == 0);
    for (int seq = 2; seq <= 3; seq++) {
        n = request(m, seq);
        CHECK("send on the connected socket", send(b, m, n, 0) == (ssize_t)n);
        reply(seq == 2 ? "the second" : "the third", b, ident, seq, &peer, 64);
    }
    /* Replies go to their identifier's socket only. */
    struct pollfd p = {.fd = s, .events = POLLIN};
    CHECK("nothing for the first socket", poll(&p, 1, 200) == 0);
    close(b);
    close(s);
    if (failures == 0)
        printf("all ok\n");
    return failures ? 1 : 0;
}
