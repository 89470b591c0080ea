/* Ancillary data on UDP sockets, as DNS, NTP and QUIC servers use it: a socket
 * bound to the wildcard address learns where each datagram was sent
 * (IP_PKTINFO, IPV6_RECVPKTINFO), with its TTL and TOS (IP_RECVTTL,
 * IP_RECVTOS), and answers from that address (IP_PKTINFO on sendmsg). The same
 * answers under the shim as on the kernel.
 *
 *   udp_pktinfo ADDR PORT      (ADDR: an IPv4 address of the stack; PORT, PORT+1 used)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static int one = 1;

static int readable(int s) {
    struct pollfd p = {.fd = s, .events = POLLIN};
    return poll(&p, 1, 5000) == 1;
}

/* One recvmsg into `buf` with `room` bytes of control space; returns its length. */
static ssize_t receive(int s, char *data, size_t cap, char *control, size_t room,
                       struct msghdr *m, struct sockaddr_storage *from) {
    static struct iovec v;
    v.iov_base = data;
    v.iov_len = cap;
    memset(m, 0, sizeof *m);
    m->msg_name = from;
    m->msg_namelen = sizeof *from;
    m->msg_iov = &v;
    m->msg_iovlen = 1;
    m->msg_control = room ? control : NULL;
    m->msg_controllen = room;
    if (!readable(s))
        return -1;
    return recvmsg(s, m, 0);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: udp_pktinfo ADDR PORT\n");
        return 2;
    }
    int port = atoi(argv[2]);
    struct in_addr addr;
    if (inet_pton(AF_INET, argv[1], &addr) != 1)
        return 2;
    char what[160], data[64];
    union {
        char buf[256];
        struct cmsghdr align;
    } control;

    /* A wildcard-bound server asking for all three. */
    int srv = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(port)};
    CHECK("bind 0.0.0.0", bind(srv, (struct sockaddr *)&any, sizeof any) == 0);
    CHECK("IP_PKTINFO on", setsockopt(srv, IPPROTO_IP, IP_PKTINFO, &one, sizeof one) == 0);
    CHECK("IP_RECVTTL on", setsockopt(srv, IPPROTO_IP, IP_RECVTTL, &one, sizeof one) == 0);
    CHECK("IP_RECVTOS on", setsockopt(srv, IPPROTO_IP, IP_RECVTOS, &one, sizeof one) == 0);
    int v = 0;
    socklen_t vl = sizeof v;
    CHECK("getsockopt IP_PKTINFO says 1",
          getsockopt(srv, IPPROTO_IP, IP_PKTINFO, &v, &vl) == 0 && v == 1);

    int cli = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = addr};
    CHECK("send to ADDR", sendto(cli, "hello", 5, 0, (struct sockaddr *)&to, sizeof to) == 5);

    struct msghdr m;
    struct sockaddr_storage from;
    ssize_t n = receive(srv, data, sizeof data, control.buf, sizeof control.buf, &m, &from);
    CHECK("the datagram arrives", n == 5 && memcmp(data, "hello", 5) == 0);
    CHECK("all control messages fit", !(m.msg_flags & MSG_CTRUNC));
    int seen = 0, order_ok = 1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
            struct in_pktinfo pi;
            memcpy(&pi, CMSG_DATA(c), sizeof pi);
            order_ok &= seen == 0;
            seen |= 1;
            CHECK("IP_PKTINFO has an in_pktinfo", c->cmsg_len == CMSG_LEN(sizeof pi));
            CHECK("ipi_addr is ADDR", pi.ipi_addr.s_addr == addr.s_addr);
            CHECK("ipi_spec_dst is ADDR", pi.ipi_spec_dst.s_addr == addr.s_addr);
            char name[IF_NAMESIZE];
            CHECK("ipi_ifindex names an interface", if_indextoname(pi.ipi_ifindex, name) != NULL);
        } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL) {
            int ttl;
            memcpy(&ttl, CMSG_DATA(c), sizeof ttl);
            order_ok &= seen == 1;
            seen |= 2;
            snprintf(what, sizeof what, "IP_TTL is %d", ttl);
            CHECK(what, c->cmsg_len == CMSG_LEN(sizeof(int)) && ttl == 64);
        } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
            order_ok &= seen == 3;
            seen |= 4;
            snprintf(what, sizeof what, "IP_TOS is %d", *(unsigned char *)CMSG_DATA(c));
            CHECK(what, c->cmsg_len == CMSG_LEN(1) && *(unsigned char *)CMSG_DATA(c) == 0);
        } else {
            snprintf(what, sizeof what, "an unexpected message %d/%d", c->cmsg_level,
                     c->cmsg_type);
            CHECK(what, 0);
        }
    }
    CHECK("IP_PKTINFO, IP_TTL, IP_TOS, in that order", seen == 7 && order_ok);

    /* The answer from the address the question went to (ipi_spec_dst). */
    struct sockaddr_in peer;
    memcpy(&peer, &from, sizeof peer);
    struct iovec rv = {.iov_base = "answer", .iov_len = 6};
    union {
        char buf[CMSG_SPACE(sizeof(struct in_pktinfo))];
        struct cmsghdr align;
    } out;
    memset(&out, 0, sizeof out);
    struct msghdr r = {.msg_name = &peer, .msg_namelen = sizeof peer, .msg_iov = &rv,
                       .msg_iovlen = 1, .msg_control = out.buf, .msg_controllen = sizeof out.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&r);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(struct in_pktinfo));
    struct in_pktinfo pi = {.ipi_spec_dst = addr};
    memcpy(CMSG_DATA(c), &pi, sizeof pi);
    CHECK("sendmsg with IP_PKTINFO", sendmsg(srv, &r, 0) == 6);
    struct sockaddr_in src;
    socklen_t sl = sizeof src;
    n = readable(cli) ? recvfrom(cli, data, sizeof data, 0, (struct sockaddr *)&src, &sl) : -1;
    CHECK("the answer arrives", n == 6 && memcmp(data, "answer", 6) == 0);
    CHECK("from ADDR and the server's port",
          src.sin_addr.s_addr == addr.s_addr && ntohs(src.sin_port) == port);

    /* Too little control space: what fits, and MSG_CTRUNC. */
    sendto(cli, "again", 5, 0, (struct sockaddr *)&to, sizeof to);
    n = receive(srv, data, sizeof data, control.buf, CMSG_SPACE(sizeof(struct in_pktinfo)), &m,
                &from);
    c = n == 5 ? CMSG_FIRSTHDR(&m) : NULL;
    CHECK("a short control buffer: IP_PKTINFO and MSG_CTRUNC",
          c && c->cmsg_type == IP_PKTINFO && (m.msg_flags & MSG_CTRUNC));
    sendto(cli, "third", 5, 0, (struct sockaddr *)&to, sizeof to);
    n = receive(srv, data, sizeof data, control.buf, 0, &m, &from);
    CHECK("no control buffer: MSG_CTRUNC",
          n == 5 && m.msg_controllen == 0 && (m.msg_flags & MSG_CTRUNC));

    /* Options off: no control messages. */
    int zero = 0;
    setsockopt(srv, IPPROTO_IP, IP_RECVTTL, &zero, sizeof zero);
    setsockopt(srv, IPPROTO_IP, IP_RECVTOS, &zero, sizeof zero);
    setsockopt(srv, IPPROTO_IP, IP_PKTINFO, &zero, sizeof zero);
    sendto(cli, "plain", 5, 0, (struct sockaddr *)&to, sizeof to);
    n = receive(srv, data, sizeof data, control.buf, sizeof control.buf, &m, &from);
    CHECK("options off: no control messages",
          n == 5 && m.msg_controllen == 0 && !(m.msg_flags & MSG_CTRUNC));

    /* recvmmsg carries them too. */
    setsockopt(srv, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
    sendto(cli, "mmsg", 4, 0, (struct sockaddr *)&to, sizeof to);
    struct iovec mv = {.iov_base = data, .iov_len = sizeof data};
    struct mmsghdr mm = {.msg_hdr = {.msg_iov = &mv, .msg_iovlen = 1, .msg_control = control.buf,
                                     .msg_controllen = sizeof control.buf}};
    int got = readable(srv) ? recvmmsg(srv, &mm, 1, 0, NULL) : -1;
    c = got == 1 ? CMSG_FIRSTHDR(&mm.msg_hdr) : NULL;
    CHECK("recvmmsg: IP_PKTINFO with ADDR",
          c && c->cmsg_type == IP_PKTINFO &&
              ((struct in_pktinfo *)CMSG_DATA(c))->ipi_addr.s_addr == addr.s_addr);
    close(srv);

    /* A dual-stack IPv6 socket: an IPv4 datagram's IPV6_PKTINFO has the mapped
     * address. */
    int s6 = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 any6 = {.sin6_family = AF_INET6, .sin6_port = htons(port + 1)};
    CHECK("bind [::]", bind(s6, (struct sockaddr *)&any6, sizeof any6) == 0);
    CHECK("IPV6_RECVPKTINFO on",
          setsockopt(s6, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof one) == 0);
    CHECK("IPV6_RECVHOPLIMIT on",
          setsockopt(s6, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof one) == 0);
    to.sin_port = htons(port + 1);
    sendto(cli, "six", 3, 0, (struct sockaddr *)&to, sizeof to);
    n = receive(s6, data, sizeof data, control.buf, sizeof control.buf, &m, &from);
    c = n == 3 ? CMSG_FIRSTHDR(&m) : NULL;
    struct in6_pktinfo pi6;
    if (c)
        memcpy(&pi6, CMSG_DATA(c), sizeof pi6);
    CHECK("IPV6_PKTINFO of an IPv4 datagram: the mapped ADDR",
          c && c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO &&
              IN6_IS_ADDR_V4MAPPED(&pi6.ipi6_addr) &&
              memcmp(&pi6.ipi6_addr.s6_addr[12], &addr, 4) == 0);
    CHECK("and no IPV6_HOPLIMIT for an IPv4 datagram", c && !CMSG_NXTHDR(&m, c));
    close(s6);
    close(cli);

    if (failures == 0) printf("all ok\n");
    return failures ? 1 : 0;
}
