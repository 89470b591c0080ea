// A statically linked program that talks to itself over TCP and UDP on the
// address given: the supervisor's relays carry every byte.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sockaddr_in at(const char *ip, int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

int main(int argc, char **argv) {
  const char *ip = argc > 1 ? argv[1] : "127.0.0.1";
  struct sockaddr_in la = at(ip, 7801), got;
  socklen_t gl = sizeof got;
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, (void *)&la, sizeof la) || listen(l, 8)) { perror("listen"); return 1; }
  getsockname(l, (void *)&got, &gl);
  printf("listening on port %d\n", ntohs(got.sin_port));
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, (void *)&la, sizeof la)) { perror("connect"); return 1; }
  struct pollfd p = {.fd = l, .events = POLLIN};
  printf("listener readable: %d\n", poll(&p, 1, 5000));
  struct sockaddr_in peer; socklen_t pl = sizeof peer;
  int s = accept(l, (void *)&peer, &pl);
  if (s < 0) { perror("accept"); return 1; }
  gl = sizeof got; getsockname(c, (void *)&got, &gl);
  printf("peer port matches: %d\n", peer.sin_port == got.sin_port);
  int type = 0; socklen_t tl = sizeof type;
  getsockopt(s, SOL_SOCKET, SO_TYPE, &type, &tl);
  printf("SO_TYPE stream: %d\n", type == SOCK_STREAM);
  write(c, "hello", 5);
  char b[64] = {0};
  ssize_t n = read(s, b, sizeof b);
  printf("server read %zd: %s\n", n, b);
  write(s, b, n);
  shutdown(s, SHUT_WR);
  memset(b, 0, sizeof b);
  n = read(c, b, sizeof b);
  printf("client read %zd: %s\n", n, b);
  printf("client then reads %zd (EOF)\n", read(c, b, sizeof b));
  close(c); close(s);
  // A child waits in a blocking accept (no poll first) on the inherited listener.
  fflush(stdout);
  pid_t kid = fork();
  if (kid == 0) {
    int k = accept(l, NULL, NULL);
    memset(b, 0, sizeof b);
    n = k < 0 ? -1 : read(k, b, sizeof b);
    printf("child accepted and read %zd: %s\n", n, b);
    exit(0);
  }
  c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, (void *)&la, sizeof la)) { perror("connect 2"); return 1; }
  write(c, "fork", 4);
  int st = 0;
  waitpid(kid, &st, 0);
  printf("child exited %d\n", WEXITSTATUS(st));
  close(c); close(l);

  int u1 = socket(AF_INET, SOCK_DGRAM, 0), u2 = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in a1 = at(ip, 7802), a2 = at(ip, 7803), from;
  bind(u1, (void *)&a1, sizeof a1); bind(u2, (void *)&a2, sizeof a2);
  sendto(u1, "ping", 4, 0, (void *)&a2, sizeof a2);
  p.fd = u2; p.events = POLLIN;
  printf("udp readable: %d\n", poll(&p, 1, 5000));
  socklen_t fl = sizeof from; memset(b, 0, sizeof b);
  n = recvfrom(u2, b, sizeof b, 0, (void *)&from, &fl);
  printf("udp got %zd: %s from port %d\n", n, b, ntohs(from.sin_port));
  p.revents = 0;
  printf("udp readable after: %d\n", poll(&p, 1, 0));

  // Control messages both ways: a TTL asked for one datagram, and what the
  // receiver's IP_PKTINFO and IP_RECVTTL report.
  setsockopt(u2, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
  setsockopt(u2, IPPROTO_IP, IP_RECVTTL, &one, sizeof one);
  union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } out;
  struct iovec iv = {.iov_base = "pong", .iov_len = 4};
  struct msghdr sm = {.msg_name = &a2, .msg_namelen = sizeof a2, .msg_iov = &iv, .msg_iovlen = 1,
                      .msg_control = out.buf, .msg_controllen = sizeof out.buf};
  struct cmsghdr *sc = CMSG_FIRSTHDR(&sm);
  sc->cmsg_level = IPPROTO_IP; sc->cmsg_type = IP_TTL; sc->cmsg_len = CMSG_LEN(sizeof(int));
  int ttl = 9; memcpy(CMSG_DATA(sc), &ttl, sizeof ttl);
  printf("sendmsg with IP_TTL: %zd\n", sendmsg(u1, &sm, 0));
  char cbuf[256];
  struct iovec rv = {.iov_base = b, .iov_len = sizeof b};
  struct msghdr rm = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &rv, .msg_iovlen = 1,
                      .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  memset(b, 0, sizeof b);
  n = recvmsg(u2, &rm, 0);
  printf("recvmsg %zd: %s, controllen %zu, flags %d\n", n, b, (size_t)rm.msg_controllen, rm.msg_flags);
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&rm); c; c = CMSG_NXTHDR(&rm, c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL) {
      int t; memcpy(&t, CMSG_DATA(c), sizeof t);
      printf("  IP_TTL %d\n", t);
    } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      struct in_pktinfo pi; memcpy(&pi, CMSG_DATA(c), sizeof pi);
      printf("  IP_PKTINFO to our address: %d, an interface: %d\n",
             pi.ipi_addr.s_addr == a2.sin_addr.s_addr, pi.ipi_ifindex > 0);
    } else {
      printf("  level %d type %d\n", c->cmsg_level, c->cmsg_type);
    }
  }
  // Too little room for the first message: cut off, flagged.
  sendto(u1, "trunc", 5, 0, (void *)&a2, sizeof a2);
  rm.msg_namelen = sizeof from; rm.msg_controllen = 8;
  n = recvmsg(u2, &rm, 0);
  printf("recvmsg %zd with 8 bytes of control room: MSG_CTRUNC %d\n", n, !!(rm.msg_flags & MSG_CTRUNC));
  // connect, then connect to AF_UNSPEC: the peer is forgotten.
  struct sockaddr unspec = {.sa_family = AF_UNSPEC};
  printf("udp connect: %d\n", connect(u1, (void *)&a2, sizeof a2));
  printf("udp send connected: %zd\n", send(u1, "c", 1, 0));
  printf("udp disconnect: %d\n", connect(u1, &unspec, sizeof unspec));
  fl = sizeof from;
  int gp = getpeername(u1, (void *)&from, &fl), gp_err = errno;
  printf("getpeername after: %d, ENOTCONN %d\n", gp, gp_err == ENOTCONN);
  ssize_t sent = send(u1, "c", 1, 0);
  printf("udp send disconnected: %zd, EDESTADDRREQ %d\n", sent, errno == EDESTADDRREQ);
  close(u1); close(u2);

  // A listener closed and made again on its port at once (iperf3 after each
  // test), twice over: the port is free each time, as on the kernel.
  for (int round = 0; round < 2; round++) {
    struct sockaddr_in ra = at(ip, 7804);
    int rl = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(rl, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rb = bind(rl, (void *)&ra, sizeof ra);
    printf("relisten %d: bind %d listen %d\n", round, rb, listen(rl, 4));
    close(rl);
  }
  return 0;
}
