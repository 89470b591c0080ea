/* Raw ICMP sockets, socket(AF_INET, SOCK_RAW, IPPROTO_ICMP) and
 * socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6), as traceroute -I, fping, mtr and
 * ping with privileges use them: the program writes whole ICMP messages (its
 * own identifier and, for IPv4, its own checksum; IPv6's is the stack's) and
 * reads a copy of every ICMP message of the family to its address, an IPv4 one
 * after its IP header, less the types its filter blocks. The same answers under
 * the shim as on the kernel (run as root there).
 *
 *   raw_icmp ADDR PORT   (ADDR: an IPv4 address that answers echoes; its IPv6
 *                         peer is ::1 beside 127.0.0.1, else fd71::1, the
 *                         preload test's stack. PORT: the echo identifier.)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/icmp.h>
#include <netinet/icmp6.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "inet_checksum.h"

static const char DATA[] = "usnet raw data";

/* An echo request (`type`) with identifier `id`, sequence `seq` and DATA; with
 * its checksum when `sum`. Returns its length. */
static size_t echo(unsigned char *m, int type, int id, int seq, int sum) {
    memset(m, 0, 8);
    m[0] = type;
    m[4] = id >> 8, m[5] = id & 0xff;
    m[6] = seq >> 8, m[7] = seq & 0xff;
    memcpy(m + 8, DATA, sizeof DATA);
    size_t n = 8 + sizeof DATA;
    if (sum) {
        uint16_t c = checksum(m, n);
        m[2] = c >> 8, m[3] = c & 0xff;
    }
    return n;
}

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

/* Reads messages from `s` for up to 5 s until one whose ICMP part (after `skip`
 * bytes, -1: the IPv4 header's length) has `type`, identifier `id` and sequence
 * `seq`. Returns its whole length (0: none), the message in `m`, the sender in
 * `from`. Other ICMP traffic of the machine may come first: skipped. */
static ssize_t wait_for(int s, unsigned char *m, size_t cap, int skip, int type, int id, int seq,
                        struct sockaddr_storage *from) {
    long long end = now_ms() + 5000;
    for (;;) {
        long long left = end - now_ms();
        struct pollfd p = {.fd = s, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) != 1)
            return 0;
        socklen_t len = sizeof *from;
        ssize_t n = recvfrom(s, m, cap, 0, (struct sockaddr *)from, &len);
        if (n <= 0)
            return 0;
        int off = skip >= 0 ? skip : (m[0] & 15) * 4;
        if (n >= off + 8 && m[off] == type && (m[off + 4] << 8 | m[off + 5]) == id &&
            (m[off + 6] << 8 | m[off + 7]) == seq)
            return n;
    }
}

static void ipv4(const char *addr, int id) {
    struct sockaddr_in peer = {.sin_family = AF_INET};
    inet_pton(AF_INET, addr, &peer.sin_addr);
    int s = socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
    CHECK("socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)", s >= 0);
    int v = -1;
    socklen_t len = sizeof v;
    CHECK("SO_TYPE: SOCK_RAW", getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &len) == 0 && v == SOCK_RAW);
    CHECK("SO_PROTOCOL: IPPROTO_ICMP",
          getsockopt(s, SOL_SOCKET, SO_PROTOCOL, &v, &len) == 0 && v == IPPROTO_ICMP);
    struct sockaddr_in me;
    len = sizeof me;
    CHECK("getsockname: the wildcard, port IPPROTO_ICMP",
          getsockname(s, (struct sockaddr *)&me, &len) == 0 && me.sin_addr.s_addr == 0 &&
              ntohs(me.sin_port) == IPPROTO_ICMP);

    /* A second raw socket that takes every type: it sees the request too. */
    int all = socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
    /* The first blocks every type but echo replies. */
    struct icmp_filter f = {.data = ~(1U << ICMP_ECHOREPLY)};
    CHECK("ICMP_FILTER", setsockopt(s, SOL_RAW, ICMP_FILTER, &f, sizeof f) == 0);
    struct icmp_filter g = {0};
    len = sizeof g;
    CHECK("ICMP_FILTER reads back",
          getsockopt(s, SOL_RAW, ICMP_FILTER, &g, &len) == 0 && g.data == f.data);

    unsigned char m[2048];
    size_t n = echo(m, ICMP_ECHO, id, 1, 1);
    CHECK("an echo request is sent as written",
          sendto(s, m, n, 0, (struct sockaddr *)&peer, sizeof peer) == (ssize_t)n);
    struct sockaddr_storage from;
    ssize_t got = wait_for(s, m, sizeof m, -1, ICMP_ECHOREPLY, id, 1, &from);
    CHECK("the echo reply arrives", got > 0);
    if (got > 0) {
        struct iphdr ip;
        memcpy(&ip, m, sizeof ip);
        int hl = ip.ihl * 4;
        CHECK("after its IPv4 header: version 4, protocol ICMP, from the peer",
              ip.version == 4 && ip.protocol == IPPROTO_ICMP && ip.saddr == peer.sin_addr.s_addr);
        CHECK("the header checksum is right", checksum(m, hl) == 0);
        CHECK("the message: its checksum right, the request's data",
              got - hl == (ssize_t)n && checksum(m + hl, got - hl) == 0 &&
                  memcmp(m + hl + 8, DATA, sizeof DATA) == 0);
        struct sockaddr_in *a = (struct sockaddr_in *)&from;
        CHECK("from the peer, port 0",
              a->sin_family == AF_INET && a->sin_addr.s_addr == peer.sin_addr.s_addr &&
                  a->sin_port == 0);
    }
    CHECK("the unfiltered socket saw the request",
          wait_for(all, m, sizeof m, -1, ICMP_ECHO, id, 1, &from) > 0);
    CHECK("and the reply", wait_for(all, m, sizeof m, -1, ICMP_ECHOREPLY, id, 1, &from) > 0);
    /* The filter held the request back from the first. */
    struct pollfd p = {.fd = s, .events = POLLIN};
    int blocked = 1;
    while (poll(&p, 1, 200) == 1) {
        ssize_t k = recv(s, m, sizeof m, 0);
        if (k >= 28 && m[(m[0] & 15) * 4] != ICMP_ECHOREPLY)
            blocked = 0;
        if (k <= 0)
            break;
    }
    CHECK("the filtered socket saw no other type", blocked);

    /* bind narrows what it reads to one address (a raw socket may be bound
     * again), connect to one peer's messages (then no more binds). */
    struct sockaddr_in here = {.sin_family = AF_INET, .sin_addr = peer.sin_addr};
    CHECK("bind to an address", bind(s, (struct sockaddr *)&here, sizeof here) == 0);
    len = sizeof me;
    CHECK("getsockname names it",
          getsockname(s, (struct sockaddr *)&me, &len) == 0 &&
              me.sin_addr.s_addr == peer.sin_addr.s_addr && ntohs(me.sin_port) == IPPROTO_ICMP);
    CHECK("bound again", bind(s, (struct sockaddr *)&here, sizeof here) == 0);
    CHECK("connect", connect(s, (struct sockaddr *)&peer, sizeof peer) == 0);
    CHECK("a bind once connected: EINVAL",
          bind(s, (struct sockaddr *)&here, sizeof here) == -1 && errno == EINVAL);
    n = echo(m, ICMP_ECHO, id, 2, 1);
    CHECK("send on the connected socket", send(s, m, n, 0) == (ssize_t)n);
    CHECK("its reply arrives", wait_for(s, m, sizeof m, -1, ICMP_ECHOREPLY, id, 2, &from) > 0);
    close(all);
    close(s);
}

static void ipv6(const char *addr, int id) {
    struct sockaddr_in6 peer = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, addr, &peer.sin6_addr);
    int s = socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6);
    CHECK("socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6)", s >= 0);
    int v = -1;
    socklen_t len = sizeof v;
    CHECK("SO_PROTOCOL: IPPROTO_ICMPV6",
          getsockopt(s, SOL_SOCKET, SO_PROTOCOL, &v, &len) == 0 && v == IPPROTO_ICMPV6);
    struct sockaddr_in6 me;
    len = sizeof me;
    CHECK("getsockname: port IPPROTO_ICMPV6",
          getsockname(s, (struct sockaddr *)&me, &len) == 0 && ntohs(me.sin6_port) == IPPROTO_ICMPV6);
    len = sizeof v;
    CHECK("IPV6_CHECKSUM: offset 2, the stack's",
          getsockopt(s, SOL_RAW, IPV6_CHECKSUM, &v, &len) == 0 && v == 2);
    v = 2;
    CHECK("IPV6_CHECKSUM at IPPROTO_IPV6: EINVAL (RFC 3542)",
          setsockopt(s, IPPROTO_IPV6, IPV6_CHECKSUM, &v, sizeof v) == -1 && errno == EINVAL);
    /* ping6's filter: echo replies alone. */
    struct icmp6_filter f;
    ICMP6_FILTER_SETBLOCKALL(&f);
    ICMP6_FILTER_SETPASS(ICMP6_ECHO_REPLY, &f);
    CHECK("ICMP6_FILTER", setsockopt(s, IPPROTO_ICMPV6, ICMP6_FILTER, &f, sizeof f) == 0);
    struct icmp6_filter g;
    len = sizeof g;
    CHECK("ICMP6_FILTER reads back",
          getsockopt(s, IPPROTO_ICMPV6, ICMP6_FILTER, &g, &len) == 0 && len == sizeof g &&
              memcmp(&f, &g, sizeof f) == 0);
    int on = 1;
    CHECK("IPV6_RECVHOPLIMIT", setsockopt(s, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &on, sizeof on) == 0);

    unsigned char m[2048];
    size_t n = echo(m, ICMP6_ECHO_REQUEST, id, 1, 0);
    CHECK("an echo request without its checksum is sent",
          sendto(s, m, n, 0, (struct sockaddr *)&peer, sizeof peer) == (ssize_t)n);
    struct sockaddr_storage from;
    ssize_t got = wait_for(s, m, sizeof m, 0, ICMP6_ECHO_REPLY, id, 1, &from);
    CHECK("the peer answered it (the stack summed it): no IPv6 header before the reply",
          got == (ssize_t)n && memcmp(m + 8, DATA, sizeof DATA) == 0);
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&from;
    CHECK("from the peer, port 0",
          a->sin6_family == AF_INET6 && memcmp(&a->sin6_addr, &peer.sin6_addr, 16) == 0 &&
              a->sin6_port == 0);
    CHECK("too short for a checksum: EINVAL",
          sendto(s, m, 2, 0, (struct sockaddr *)&peer, sizeof peer) == -1 && errno == EINVAL);
    struct sockaddr_in v4 = {.sin_family = AF_INET};
    CHECK("an IPv4 destination: refused",
          sendto(s, m, n, 0, (struct sockaddr *)&v4, sizeof v4) == -1);
    close(s);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    int id = atoi(argv[2]);
    ipv4(argv[1], id);
    ipv6(strcmp(argv[1], "127.0.0.1") == 0 ? "::1" : "fd71::1", id + 1);
    if (failures == 0)
        printf("all ok\n");
    return failures ? 1 : 0;
}
