/* Receive timestamps on a UDP socket, as NTP servers and clients take them
 * (SO_TIMESTAMP, SO_TIMESTAMPNS, SO_TIMESTAMPING's software receive stamp): a
 * control message in recvmsg, on CLOCK_REALTIME, between the send and the
 * receive. Then SOL_SOCKET options a kernel-tuned daemon sets, which Linux
 * accepts on any socket: set and read back. The same answers under the shim as
 * on the kernel.
 *
 *   udp_timestamps ADDR PORT      (ADDR: an IPv4 address of the stack)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/net_tstamp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int rx, tx;
static struct sockaddr_in to;

/* Sends one datagram to the receiver and receives it: the control messages it
 * came with (level, type, length, the stamp in ns for the timestamp kinds), and
 * whether each stamp lies between the send and the receive (a microsecond of
 * slack for SCM_TIMESTAMP's rounding down). */
static void round_trip(const char *what, int want_types[], int n_want) {
    long long before = now_ns();
    sendto(tx, "x", 1, 0, (struct sockaddr *)&to, sizeof to);
    char data[16], line[200];
    union {
        char buf[256];
        struct cmsghdr align;
    } control;
    struct iovec v = {.iov_base = data, .iov_len = sizeof data};
    struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = control.buf,
                       .msg_controllen = sizeof control.buf};
    struct pollfd p = {.fd = rx, .events = POLLIN};
    ssize_t n = poll(&p, 1, 5000) == 1 ? recvmsg(rx, &m, 0) : -1;
    long long after = now_ns();
    CHECK(what, n == 1);
    int k = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); n == 1 && c; c = CMSG_NXTHDR(&m, c), k++) {
        long long stamp = -1;
        size_t want_len = 0;
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMP) {
            struct timeval t;
            memcpy(&t, CMSG_DATA(c), sizeof t);
            stamp = t.tv_sec * 1000000000LL + t.tv_usec * 1000LL;
            want_len = sizeof t;
        } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec t;
            memcpy(&t, CMSG_DATA(c), sizeof t);
            stamp = t.tv_sec * 1000000000LL + t.tv_nsec;
            want_len = sizeof t;
        } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPING) {
            struct timespec t[3];
            memcpy(t, CMSG_DATA(c), sizeof t);
            stamp = t[0].tv_sec * 1000000000LL + t[0].tv_nsec;
            want_len = sizeof t;
        }
        int in_range = stamp >= before - 1000 && stamp <= after;
        snprintf(line, sizeof line, "%s: message %d is %d/%d, its length and time right", what,
                 k, c->cmsg_level, c->cmsg_type);
        CHECK(line,
              k < n_want && c->cmsg_type == want_types[k] &&
                  c->cmsg_len == CMSG_LEN(want_len) && in_range);
    }
    snprintf(line, sizeof line, "%s: %d messages", what, n_want);
    CHECK(line, k == n_want);
}

static int opt(int s, int name) {
    int v = -2;
    socklen_t l = sizeof v;
    getsockopt(s, SOL_SOCKET, name, &v, &l);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: udp_timestamps ADDR PORT\n");
        return 2;
    }
    int port = atoi(argv[2]), one = 1, zero = 0;
    to = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, argv[1], &to.sin_addr) != 1)
        return 2;
    rx = socket(AF_INET, SOCK_DGRAM, 0);
    tx = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK("bind the receiver", bind(rx, (struct sockaddr *)&to, sizeof to) == 0);

    round_trip("no option", NULL, 0);

    CHECK("SO_TIMESTAMP on", setsockopt(rx, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one) == 0);
    CHECK("SO_TIMESTAMP reads 1", opt(rx, SO_TIMESTAMP) == 1);
    round_trip("SO_TIMESTAMP", (int[]){SCM_TIMESTAMP}, 1);

    /* One format at a time: SO_TIMESTAMPNS on reads SO_TIMESTAMP as off. */
    CHECK("SO_TIMESTAMPNS on", setsockopt(rx, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) == 0);
    CHECK("SO_TIMESTAMPNS reads 1, SO_TIMESTAMP 0",
          opt(rx, SO_TIMESTAMPNS) == 1 && opt(rx, SO_TIMESTAMP) == 0);
    round_trip("SO_TIMESTAMPNS", (int[]){SCM_TIMESTAMPNS}, 1);

    int flags = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
    CHECK("SO_TIMESTAMPING with software receive stamps",
          setsockopt(rx, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof flags) == 0);
    round_trip("SO_TIMESTAMPNS and SO_TIMESTAMPING", (int[]){SCM_TIMESTAMPNS, SCM_TIMESTAMPING},
               2);

    /* Either off turns both off. (SO_TIMESTAMPING alone is not tried: whether
     * the kernel stamped a datagram then depends on what else on the machine
     * turned timestamps on.) */
    CHECK("SO_TIMESTAMPING off",
          setsockopt(rx, SOL_SOCKET, SO_TIMESTAMPING, &zero, sizeof zero) == 0);
    CHECK("SO_TIMESTAMP off", setsockopt(rx, SOL_SOCKET, SO_TIMESTAMP, &zero, sizeof zero) == 0);
    CHECK("both read 0", opt(rx, SO_TIMESTAMP) == 0 && opt(rx, SO_TIMESTAMPNS) == 0);
    round_trip("all off", NULL, 0);

    /* Options Linux takes on any socket: set, then read back. */
    int names[] = {SO_NO_CHECK, SO_RXQ_OVFL, SO_OOBINLINE, SO_DONTROUTE, SO_SELECT_ERR_QUEUE};
    const char *labels[] = {"SO_NO_CHECK", "SO_RXQ_OVFL", "SO_OOBINLINE", "SO_DONTROUTE",
                            "SO_SELECT_ERR_QUEUE"};
    for (int i = 0; i < 5; i++) {
        char line[100];
        for (int s = 0; s < 2; s++) {
            int fd = s ? tx : socket(AF_INET6, SOCK_STREAM, 0);
            snprintf(line, sizeof line, "%s on a %s socket: set and read back", labels[i],
                     s ? "UDP" : "TCP");
            CHECK(line,
                  setsockopt(fd, SOL_SOCKET, names[i], &one, sizeof one) == 0 &&
                      opt(fd, names[i]) == 1);
            if (!s)
                close(fd);
        }
    }
    /* SO_RCVBUFFORCE: as SO_RCVBUF for a process with CAP_NET_ADMIN, else EPERM. */
    int big = 1 << 20;
    errno = 0;
    int r = setsockopt(rx, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
    int root = geteuid() == 0;
    CHECK("SO_RCVBUFFORCE: the doubled size as root, else EPERM",
          root ? r == 0 && opt(rx, SO_RCVBUF) == 2 * big : r == -1 && errno == EPERM);

    close(tx);
    close(rx);
    if (failures == 0) printf("all ok\n");
    return failures ? 1 : 0;
}
