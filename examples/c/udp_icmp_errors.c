/* ICMP errors on UDP sockets, as DNS resolvers, traceroute, tracepath and QUIC
 * stacks meet them: a port unreachable fails a connected socket's next recv or
 * send with ECONNREFUSED (once), shows as POLLERR and SO_ERROR, and is ignored
 * by an unconnected socket; with IP_RECVERR each error also waits on the
 * error queue, where recvmsg(MSG_ERRQUEUE) reads the quoted payload, the
 * quoted destination as the name, a sock_extended_err with the offender and,
 * with IP_RECVTTL, the ICMP packet's TTL. The same answers under the shim as
 * on the kernel.
 *
 *   udp_icmp_errors ADDR PORT   (ADDR: a local address; PORT..PORT+4 closed)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"

/* Waits up to `ms` for POLLERR on `s`; returns the events seen. */
static int wait_err(int s, int ms) {
    struct pollfd p = {.fd = s, .events = POLLIN};
    if (poll(&p, 1, ms) != 1)
        return 0;
    return p.revents;
}

/* What one recvmsg(MSG_ERRQUEUE) gave. */
struct report {
    ssize_t n;
    int flags;
    struct sockaddr_in6 name; /* room for either family */
    int have_ee, level, type, ttl;
    struct sock_extended_err ee;
    struct sockaddr_in6 offender;
    char data[64];
};

static void read_report(int s, size_t room, struct report *r) {
    memset(r, 0, sizeof *r);
    r->ttl = -1;
    union {
        char buf[256];
        struct cmsghdr align;
    } control;
    struct iovec v = {.iov_base = r->data, .iov_len = room};
    struct msghdr msg = {.msg_name = &r->name, .msg_namelen = sizeof r->name, .msg_iov = &v,
                         .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    r->n = recvmsg(s, &msg, MSG_ERRQUEUE);
    if (r->n < 0)
        return;
    r->flags = msg.msg_flags;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if ((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
            (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)) {
            r->have_ee = 1;
            r->level = c->cmsg_level;
            r->type = c->cmsg_type;
            memcpy(&r->ee, CMSG_DATA(c), sizeof r->ee);
            size_t left = c->cmsg_len - CMSG_LEN(sizeof r->ee);
            if (left > sizeof r->offender)
                left = sizeof r->offender;
            memcpy(&r->offender, (char *)CMSG_DATA(c) + sizeof r->ee, left);
        } else if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_TTL) {
            memcpy(&r->ttl, CMSG_DATA(c), sizeof r->ttl);
        }
    }
}

static int so_error(int s) {
    int v = -1;
    socklen_t len = sizeof v;
    return getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &len) == 0 ? v : -1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    struct sockaddr_in to = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, argv[1], &to.sin_addr) != 1)
        return 2;
    int port = atoi(argv[2]);
    char buf[64];

    /* A connected socket: the hard error fails the next call, once. */
    int c = socket(AF_INET, SOCK_DGRAM, 0);
    to.sin_port = htons(port);
    CHECK("connect to a closed port", connect(c, (struct sockaddr *)&to, sizeof to) == 0);
    CHECK("send", send(c, "one", 3, 0) == 3);
    CHECK("POLLERR, not POLLIN", wait_err(c, 5000) == POLLERR);
    CHECK("recv: ECONNREFUSED", recv(c, buf, sizeof buf, 0) == -1 && errno == ECONNREFUSED);
    CHECK("then nothing: EAGAIN",
          recv(c, buf, sizeof buf, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    CHECK("no POLLERR left", wait_err(c, 0) == 0);
    CHECK("send again", send(c, "two", 3, 0) == 3);
    CHECK("POLLERR again", wait_err(c, 5000) == POLLERR);
    CHECK("the next send: ECONNREFUSED", send(c, "three", 5, 0) == -1 && errno == ECONNREFUSED);
    CHECK("send once more", send(c, "four", 4, 0) == 4);
    CHECK("POLLERR once more", wait_err(c, 5000) == POLLERR);
    CHECK("SO_ERROR: ECONNREFUSED, taken", so_error(c) == ECONNREFUSED && so_error(c) == 0);
    CHECK("recv after SO_ERROR: EAGAIN",
          recv(c, buf, sizeof buf, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    CHECK("MSG_ERRQUEUE without IP_RECVERR: EAGAIN",
          recv(c, buf, sizeof buf, MSG_ERRQUEUE) == -1 && errno == EAGAIN);
    /* A recv blocked when the error comes wakes with it (not at its timeout). */
    struct timeval tv = {.tv_sec = 5};
    CHECK("SO_RCVTIMEO 5 s", setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
    CHECK("send a last one", send(c, "five", 4, 0) == 4);
    CHECK("a blocked recv wakes with ECONNREFUSED",
          recv(c, buf, sizeof buf, 0) == -1 && errno == ECONNREFUSED);
    close(c);

    /* Unconnected, without IP_RECVERR: ignored. */
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    to.sin_port = htons(port + 1);
    CHECK("sendto a closed port",
          sendto(u, "x", 1, 0, (struct sockaddr *)&to, sizeof to) == 1);
    CHECK("unconnected: no POLLERR", wait_err(u, 300) == 0);
    CHECK("unconnected: no error", so_error(u) == 0);

    /* IP_RECVERR: every error waits on the error queue and is pending too. */
    int on = 1;
    CHECK("IP_RECVERR", setsockopt(u, SOL_IP, IP_RECVERR, &on, sizeof on) == 0);
    CHECK("IP_RECVTTL", setsockopt(u, SOL_IP, IP_RECVTTL, &on, sizeof on) == 0);
    int v = 0;
    socklen_t len = sizeof v;
    CHECK("IP_RECVERR reads back",
          getsockopt(u, SOL_IP, IP_RECVERR, &v, &len) == 0 && v == 1);
    to.sin_port = htons(port + 2);
    CHECK("sendto a probe", sendto(u, "probe-1", 7, 0, (struct sockaddr *)&to, sizeof to) == 7);
    CHECK("POLLERR for the report", wait_err(u, 5000) == POLLERR);
    struct report r;
    read_report(u, sizeof r.data, &r);
    CHECK("recvmsg(MSG_ERRQUEUE): the quoted payload",
          r.n == 7 && memcmp(r.data, "probe-1", 7) == 0);
    CHECK("msg_flags: MSG_ERRQUEUE", r.flags == MSG_ERRQUEUE);
    struct sockaddr_in *name = (struct sockaddr_in *)&r.name;
    CHECK("the name: where the probe went",
          name->sin_family == AF_INET && name->sin_addr.s_addr == to.sin_addr.s_addr &&
              name->sin_port == to.sin_port);
    CHECK("an IP_RECVERR message", r.have_ee && r.level == SOL_IP && r.type == IP_RECVERR);
    CHECK("ee_errno ECONNREFUSED, from ICMP", r.ee.ee_errno == ECONNREFUSED &&
                                                  r.ee.ee_origin == SO_EE_ORIGIN_ICMP);
    CHECK("type 3 code 3, no info", r.ee.ee_type == 3 && r.ee.ee_code == 3 &&
                                        r.ee.ee_info == 0 && r.ee.ee_data == 0);
    struct sockaddr_in *off = (struct sockaddr_in *)&r.offender;
    CHECK("the offender: the host that answered",
          off->sin_family == AF_INET && off->sin_addr.s_addr == to.sin_addr.s_addr &&
              off->sin_port == 0);
    CHECK("the ICMP packet's TTL (IP_RECVTTL)", r.ttl == 64);
    CHECK("reading it took the pending error", so_error(u) == 0);
    read_report(u, sizeof r.data, &r);
    CHECK("the queue is empty: EAGAIN", r.n == -1 && errno == EAGAIN);

    /* Pending and queued at once: a plain recv takes the error, the report stays. */
    CHECK("sendto another probe",
          sendto(u, "probe-2 longer", 14, 0, (struct sockaddr *)&to, sizeof to) == 14);
    CHECK("POLLERR", wait_err(u, 5000) == POLLERR);
    CHECK("recv: ECONNREFUSED", recv(u, buf, sizeof buf, MSG_DONTWAIT) == -1 &&
                                    errno == ECONNREFUSED);
    CHECK("still POLLERR: the report waits", wait_err(u, 0) == POLLERR);
    read_report(u, 5, &r);
    CHECK("a short buffer: MSG_TRUNC", r.n == 5 && r.flags == (MSG_ERRQUEUE | MSG_TRUNC) &&
                                           memcmp(r.data, "probe", 5) == 0);
    CHECK("nothing left", wait_err(u, 0) == 0);

    /* Off again: errors are ignored once more. */
    on = 0;
    CHECK("IP_RECVERR off", setsockopt(u, SOL_IP, IP_RECVERR, &on, sizeof on) == 0);
    CHECK("sendto", sendto(u, "x", 1, 0, (struct sockaddr *)&to, sizeof to) == 1);
    CHECK("ignored again", wait_err(u, 300) == 0);
    close(u);

    /* A dual-stack socket sending to an IPv4-mapped address: IP_RECVERR governs
     * IPv4's errors; the report comes as IPV6_RECVERR, the addresses mapped. */
    int d = socket(AF_INET6, SOCK_DGRAM, 0);
    on = 1;
    CHECK("IP_RECVERR on an IPv6 socket", setsockopt(d, SOL_IP, IP_RECVERR, &on, sizeof on) == 0);
    struct sockaddr_in6 to6 = {.sin6_family = AF_INET6, .sin6_port = htons(port + 3)};
    to6.sin6_addr.s6_addr[10] = 0xff;
    to6.sin6_addr.s6_addr[11] = 0xff;
    memcpy(&to6.sin6_addr.s6_addr[12], &to.sin_addr, 4);
    CHECK("sendto a mapped address",
          sendto(d, "mapped", 6, 0, (struct sockaddr *)&to6, sizeof to6) == 6);
    CHECK("POLLERR", wait_err(d, 5000) == POLLERR);
    read_report(d, sizeof r.data, &r);
    CHECK("the report", r.n == 6 && memcmp(r.data, "mapped", 6) == 0);
    CHECK("the name: the mapped destination",
          r.name.sin6_family == AF_INET6 &&
              memcmp(&r.name.sin6_addr, &to6.sin6_addr, 16) == 0 &&
              r.name.sin6_port == to6.sin6_port);
    CHECK("IPV6_RECVERR, origin ICMP",
          r.have_ee && r.level == SOL_IPV6 && r.type == IPV6_RECVERR &&
              r.ee.ee_origin == SO_EE_ORIGIN_ICMP && r.ee.ee_errno == ECONNREFUSED);
    CHECK("the offender, mapped",
          r.offender.sin6_family == AF_INET6 &&
              memcmp(&r.offender.sin6_addr, &to6.sin6_addr, 16) == 0);
    close(d);

    printf(failures ? "%d failed\n" : "all ok\n", failures);
    return failures != 0;
}
