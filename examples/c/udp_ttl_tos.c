/* The TTL and TOS of the datagrams a UDP socket sends, as QUIC stacks (ECN),
 * traceroute and DSCP-marking servers set them: per socket (IP_TTL, IP_TOS)
 * and per send (IP_TTL and IP_TOS control messages on sendmsg), on an IPv4
 * socket and on a dual-stack IPv6 one sending to an IPv4-mapped address. A
 * receiver with IP_RECVTTL and IP_RECVTOS reads what was sent. The same
 * answers under the shim as on the kernel. And IPV6_MTU, the size a socket's
 * IPv6 datagrams fragment at.
 *
 *   udp_ttl_tos ADDR PORT      (ADDR: an IPv4 address of the stack)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static int rx;

/* Receives one datagram on `rx`: its TTL and TOS into *ttl and *tos (-1 when
 * missing); returns its length, or -1. */
static ssize_t receive(int *ttl, int *tos) {
    char data[64];
    union {
        char buf[128];
        struct cmsghdr align;
    } control;
    struct iovec v = {.iov_base = data, .iov_len = sizeof data};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = control.buf,
                       .msg_controllen = sizeof control.buf};
    struct pollfd p = {.fd = rx, .events = POLLIN};
    *ttl = *tos = -1;
    if (poll(&p, 1, 5000) != 1)
        return -1;
    ssize_t n = recvmsg(rx, &m, 0);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); n >= 0 && c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL)
            memcpy(ttl, CMSG_DATA(c), sizeof *ttl);
        else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS)
            *tos = *(unsigned char *)CMSG_DATA(c);
    }
    return n;
}

/* Sends "x" from `s` to `to` with up to two control messages, each an int
 * (or, with `tos_byte`, IP_TOS as one byte); type 0 is none. Returns sendmsg's
 * result. */
static ssize_t send_with(int s, const void *to, socklen_t tolen, int level, int t1, int v1,
                         int t2, int v2, int tos_byte) {
    union {
        char buf[2 * CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } out;
    memset(&out, 0, sizeof out);
    struct iovec v = {.iov_base = "x", .iov_len = 1};
    struct msghdr m = {.msg_name = (void *)to, .msg_namelen = tolen, .msg_iov = &v,
                       .msg_iovlen = 1, .msg_control = out.buf, .msg_controllen = 0};
    /* msg_controllen grows as messages are added: CMSG_FIRSTHDR would see none. */
    struct cmsghdr *c = (struct cmsghdr *)out.buf;
    int types[2] = {t1, t2}, values[2] = {v1, v2};
    for (int i = 0; i < 2; i++) {
        if (!types[i])
            continue;
        int one_byte = tos_byte && types[i] == IP_TOS;
        size_t len = one_byte ? 1 : sizeof(int);
        m.msg_controllen += CMSG_SPACE(len);
        c->cmsg_level = level;
        c->cmsg_type = types[i];
        c->cmsg_len = CMSG_LEN(len);
        if (one_byte)
            *(unsigned char *)CMSG_DATA(c) = values[i];
        else
            memcpy(CMSG_DATA(c), &values[i], sizeof(int));
        c = (struct cmsghdr *)((char *)c + CMSG_SPACE(len));
    }
    if (!m.msg_controllen)
        m.msg_control = NULL;
    return sendmsg(s, &m, 0);
}

/* The next datagram on the receiver: checks its TTL and TOS. */
static void arrives(const char *what, int want_ttl, int want_tos) {
    int ttl, tos;
    char line[160];
    ssize_t n = receive(&ttl, &tos);
    snprintf(line, sizeof line, "%s: TTL %d, TOS %#x", what, ttl, tos);
    CHECK(line, n == 1 && ttl == want_ttl && tos == want_tos);
}

static int opt(int s, int level, int name) {
    int v = -2;
    socklen_t l = sizeof v;
    getsockopt(s, level, name, &v, &l);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: udp_ttl_tos ADDR PORT\n");
        return 2;
    }
    int port = atoi(argv[2]), one = 1;
    struct in_addr addr;
    if (inet_pton(AF_INET, argv[1], &addr) != 1)
        return 2;
    char line[160];

    rx = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(port)};
    CHECK("bind the receiver", bind(rx, (struct sockaddr *)&any, sizeof any) == 0);
    setsockopt(rx, IPPROTO_IP, IP_RECVTTL, &one, sizeof one);
    setsockopt(rx, IPPROTO_IP, IP_RECVTOS, &one, sizeof one);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = addr};

    int s = socket(AF_INET, SOCK_DGRAM, 0);
    sendto(s, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
    arrives("the defaults", 64, 0);

    /* The socket's own, set before and read back. */
    int ttl = 7, tos = 0xb8;
    CHECK("IP_TTL 7", setsockopt(s, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl) == 0);
    CHECK("IP_TOS 0xb8", setsockopt(s, IPPROTO_IP, IP_TOS, &tos, sizeof tos) == 0);
    snprintf(line, sizeof line, "getsockopt: TTL %d, TOS %#x", opt(s, IPPROTO_IP, IP_TTL),
             opt(s, IPPROTO_IP, IP_TOS));
    CHECK(line, opt(s, IPPROTO_IP, IP_TTL) == 7 && opt(s, IPPROTO_IP, IP_TOS) == 0xb8);
    sendto(s, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
    arrives("the socket's", 7, 0xb8);

    /* One send's: both as ints, then TOS as one byte, then TOS alone. */
    CHECK("sendmsg with IP_TTL 3 and IP_TOS 1",
          send_with(s, &to, sizeof to, IPPROTO_IP, IP_TTL, 3, IP_TOS, 1, 0) == 1);
    arrives("the send's", 3, 1);
    CHECK("sendmsg with a one-byte IP_TOS",
          send_with(s, &to, sizeof to, IPPROTO_IP, IP_TOS, 0x22, 0, 0, 1) == 1);
    arrives("the send's TOS, the socket's TTL", 7, 0x22);
    sendto(s, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
    arrives("the socket's again", 7, 0xb8);

    /* Out of range: EINVAL, nothing sent. */
    errno = 0;
    CHECK("IP_TTL 0 on sendmsg: EINVAL",
          send_with(s, &to, sizeof to, IPPROTO_IP, IP_TTL, 0, 0, 0, 0) == -1 && errno == EINVAL);
    errno = 0;
    CHECK("IP_TOS 256 on sendmsg: EINVAL",
          send_with(s, &to, sizeof to, IPPROTO_IP, IP_TOS, 256, 0, 0, 0) == -1 && errno == EINVAL);

    /* -1 takes the default back. */
    int dflt = -1;
    CHECK("IP_TTL -1", setsockopt(s, IPPROTO_IP, IP_TTL, &dflt, sizeof dflt) == 0);
    CHECK("getsockopt: TTL 64", opt(s, IPPROTO_IP, IP_TTL) == 64);
    sendto(s, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
    arrives("the default TTL", 64, 0xb8);
    close(s);

    /* A dual-stack socket to an IPv4-mapped address: the IPv4 options and
     * messages apply; the IPv6 ones do not. */
    int s6 = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 to6 = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    to6.sin6_addr.s6_addr[10] = to6.sin6_addr.s6_addr[11] = 0xff;
    memcpy(&to6.sin6_addr.s6_addr[12], &addr, 4);
    int hops = 11, tclass = 0x28;
    ttl = 9, tos = 0x48;
    setsockopt(s6, IPPROTO_IPV6, IPV6_UNICAST_HOPS, &hops, sizeof hops);
    setsockopt(s6, IPPROTO_IPV6, IPV6_TCLASS, &tclass, sizeof tclass);
    sendto(s6, "x", 1, 0, (struct sockaddr *)&to6, sizeof to6);
    arrives("mapped, IPv6 options set", 64, 0);
    CHECK("IP_TTL on IPv6", setsockopt(s6, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl) == 0);
    CHECK("IP_TOS on IPv6", setsockopt(s6, IPPROTO_IP, IP_TOS, &tos, sizeof tos) == 0);
    sendto(s6, "x", 1, 0, (struct sockaddr *)&to6, sizeof to6);
    arrives("mapped, IPv4 options set", 9, 0x48);
    CHECK("sendmsg with IPV6_HOPLIMIT and IPV6_TCLASS",
          send_with(s6, &to6, sizeof to6, IPPROTO_IPV6, IPV6_HOPLIMIT, 5, IPV6_TCLASS, 4, 0) == 1);
    arrives("mapped, IPv6 messages ignored", 9, 0x48);
    CHECK("sendmsg with IP_TTL and IP_TOS",
          send_with(s6, &to6, sizeof to6, IPPROTO_IP, IP_TTL, 4, IP_TOS, 0x10, 0) == 1);
    arrives("mapped, IPv4 messages", 4, 0x10);
    close(s6);

    /* A connected socket's sendmsg without an address takes them too. */
    int c = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK("connect", connect(c, (struct sockaddr *)&to, sizeof to) == 0);
    CHECK("connected: sendmsg with IP_TTL and IP_TOS",
          send_with(c, NULL, 0, IPPROTO_IP, IP_TTL, 12, IP_TOS, 0x02, 0) == 1);
    arrives("connected", 12, 0x02);
    close(c);

    /* IPV6_MTU (unbound sets it to 1,280 on its IPv6 sockets): 0 or at least
     * IPv6's minimum MTU; the size IPv6 datagrams fragment at, so under a
     * strict MTU discovery mode a larger one is EMSGSIZE. Not on an IPv4
     * socket; read back only on a connected socket (the path's MTU). The IPv6
     * peer: ::1 beside 127.0.0.1, else the stack's fd71::1. */
    int u6 = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 peer6 = {.sin6_family = AF_INET6, .sin6_port = htons(port + 1)};
    inet_pton(AF_INET6, strcmp(argv[1], "127.0.0.1") == 0 ? "::1" : "fd71::1",
              &peer6.sin6_addr);
    int small = 1000, min6 = 1280, zero = 0, probe = IPV6_PMTUDISC_PROBE;
    static char big[1400];
    errno = 0;
    CHECK("IPV6_MTU 1000 is EINVAL",
          setsockopt(u6, IPPROTO_IPV6, IPV6_MTU, &small, sizeof small) == -1 && errno == EINVAL);
    CHECK("IPV6_MTU 1280",
          setsockopt(u6, IPPROTO_IPV6, IPV6_MTU, &min6, sizeof min6) == 0);
    int mtu = 0;
    socklen_t mlen = sizeof mtu;
    errno = 0;
    CHECK("IPV6_MTU of an unconnected socket is ENOTCONN",
          getsockopt(u6, IPPROTO_IPV6, IPV6_MTU, &mtu, &mlen) == -1 && errno == ENOTCONN);
    CHECK("1,400 bytes leave (in fragments)",
          sendto(u6, big, 1400, 0, (struct sockaddr *)&peer6, sizeof peer6) == 1400);
    CHECK("IPV6_MTU_DISCOVER probe",
          setsockopt(u6, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &probe, sizeof probe) == 0);
    errno = 0;
    CHECK("under probe, 1,300 bytes over IPV6_MTU are EMSGSIZE",
          sendto(u6, big, 1300, 0, (struct sockaddr *)&peer6, sizeof peer6) == -1 &&
              errno == EMSGSIZE);
    CHECK("under probe, 1,200 bytes leave",
          sendto(u6, big, 1200, 0, (struct sockaddr *)&peer6, sizeof peer6) == 1200);
    CHECK("IPV6_MTU 0", setsockopt(u6, IPPROTO_IPV6, IPV6_MTU, &zero, sizeof zero) == 0);
    CHECK("IPV6_MTU 0: the link's MTU again, 1,300 bytes leave",
          sendto(u6, big, 1300, 0, (struct sockaddr *)&peer6, sizeof peer6) == 1300);
    close(u6);
    int u4 = socket(AF_INET, SOCK_DGRAM, 0);
    errno = 0;
    CHECK("IPV6_MTU on an IPv4 socket is ENOPROTOOPT",
          setsockopt(u4, IPPROTO_IPV6, IPV6_MTU, &min6, sizeof min6) == -1 &&
              errno == ENOPROTOOPT);
    close(u4);

    close(rx);
    if (failures == 0) printf("all ok\n");
    return failures ? 1 : 0;
}
