/* connect(2) to AF_UNSPEC, as DNS resolvers and QUIC servers use it to reuse one
 * UDP socket for another peer: a connected socket hears only its peer; after the
 * disconnect it hears everyone again, send() without an address is
 * EDESTADDRREQ, getpeername is ENOTCONN, and the address the connect chose goes
 * back to the wildcard (the bound port stays). On a TCP socket that never
 * connected it does nothing. The same answers under the shim as on the kernel.
 *
 *   udp_disconnect ADDR PORT      (ADDR: an IPv4 address of the stack)
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

/* One datagram on `s` within `ms`: its payload's first byte, 0 for none. */
static char heard(int s, int ms) {
    struct pollfd p = {.fd = s, .events = POLLIN};
    char b[16] = {0};
    if (poll(&p, 1, ms) != 1)
        return 0;
    return recv(s, b, sizeof b, 0) > 0 ? b[0] : 0;
}

static int udp_bound(int port) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    return bind(s, (struct sockaddr *)&a, sizeof a) == 0 ? s : -1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: udp_disconnect ADDR PORT\n");
        return 2;
    }
    int port = atoi(argv[2]);
    struct in_addr addr;
    if (inet_pton(AF_INET, argv[1], &addr) != 1)
        return 2;
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = addr};
    struct sockaddr_in peer_at = me, other_at = me;
    peer_at.sin_port = htons(port + 1);
    other_at.sin_port = htons(port + 2);
    struct sockaddr unspec = {.sa_family = AF_UNSPEC};
    struct sockaddr_in got;
    socklen_t len;

    int s = udp_bound(port), peer = udp_bound(port + 1), other = udp_bound(port + 2);
    CHECK("bind three sockets", s >= 0 && peer >= 0 && other >= 0);
    CHECK("connect to the peer", connect(s, (struct sockaddr *)&peer_at, sizeof peer_at) == 0);
    len = sizeof got;
    getsockname(s, (struct sockaddr *)&got, &len);
    CHECK("the connect chose the route's address",
          got.sin_addr.s_addr == addr.s_addr && ntohs(got.sin_port) == port);
    sendto(peer, "p", 1, 0, (struct sockaddr *)&me, sizeof me);
    CHECK("connected: the peer is heard", heard(s, 5000) == 'p');
    sendto(other, "o", 1, 0, (struct sockaddr *)&me, sizeof me);
    CHECK("connected: another sender is not", heard(s, 300) == 0);
    CHECK("connected: send without an address", send(s, "s", 1, 0) == 1);
    CHECK("  and the peer has it", heard(peer, 5000) == 's');

    CHECK("connect to AF_UNSPEC", connect(s, &unspec, sizeof unspec) == 0);
    len = sizeof got;
    errno = 0;
    CHECK("getpeername: ENOTCONN",
          getpeername(s, (struct sockaddr *)&got, &len) == -1 && errno == ENOTCONN);
    errno = 0;
    CHECK("send without an address: EDESTADDRREQ",
          send(s, "s", 1, 0) == -1 && errno == EDESTADDRREQ);
    len = sizeof got;
    getsockname(s, (struct sockaddr *)&got, &len);
    CHECK("the address is the wildcard again, the port stays",
          got.sin_addr.s_addr == htonl(INADDR_ANY) && ntohs(got.sin_port) == port);
    sendto(other, "O", 1, 0, (struct sockaddr *)&me, sizeof me);
    CHECK("disconnected: another sender is heard", heard(s, 5000) == 'O');
    sendto(peer, "P", 1, 0, (struct sockaddr *)&me, sizeof me);
    CHECK("disconnected: the old peer too", heard(s, 5000) == 'P');
    CHECK("sendto still works",
          sendto(s, "t", 1, 0, (struct sockaddr *)&other_at, sizeof other_at) == 1 &&
              heard(other, 5000) == 't');
    CHECK("a second disconnect", connect(s, &unspec, sizeof unspec) == 0);

    CHECK("connect to another peer", connect(s, (struct sockaddr *)&other_at, sizeof other_at) == 0);
    sendto(peer, "q", 1, 0, (struct sockaddr *)&me, sizeof me);
    sendto(other, "r", 1, 0, (struct sockaddr *)&me, sizeof me);
    CHECK("  hears only the new one", heard(s, 5000) == 'r' && heard(s, 300) == 0);

    /* A socket that never bound: the connect binds it, the disconnect keeps a
     * way to send (the port it keeps differs: Linux gives it back). */
    int auto_bound = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK("connect an unbound socket",
          connect(auto_bound, (struct sockaddr *)&me, sizeof me) == 0);
    CHECK("  and disconnect it", connect(auto_bound, &unspec, sizeof unspec) == 0);
    CHECK("  sendto from it",
          sendto(auto_bound, "u", 1, 0, (struct sockaddr *)&other_at, sizeof other_at) == 1 &&
              heard(other, 5000) == 'u');

    int fresh = socket(AF_INET, SOCK_STREAM, 0);
    CHECK("TCP never connected: AF_UNSPEC does nothing",
          connect(fresh, &unspec, sizeof unspec) == 0);
    errno = 0;
    CHECK("an address too short for a family: EINVAL",
          connect(s, &unspec, 1) == -1 && errno == EINVAL);

    close(s);
    close(peer);
    close(other);
    close(auto_bound);
    close(fresh);
    if (failures)
        return 1;
    printf("all ok\n");
    return 0;
}
