/*
 * A stand-in for packetdrill's --so_filename mode: loads a backend .so the way
 * packetdrill's so_testing.c does (dlopen with RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE |
 * RTLD_DEEPBIND, dlsym "packetdrill_interface_init", init(so_flags, &ifc) into a
 * calloc'd struct), then plays scripted conversations through the function pointers:
 * IP packets in with netdev_send, the stack's packets out with netdev_receive, every
 * field and checksum checked.
 *
 * The struct below is declared from the interface packetdrill documents in
 * gtests/net/packetdrill/packetdrill.h (same members, same order, same types).
 *
 * Usage: driver <path to libusnet_packetdrill.so>
 * Exit 0 and "driver: ok" on success; on failure the failing check is printed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

struct packetdrill_interface {
	void *userdata;
	void (*free)(void *userdata);
	int (*socket)(void *userdata, int domain, int type, int protocol);
	int (*bind)(void *userdata, int sockfd, const struct sockaddr *addr, socklen_t addrlen);
	int (*listen)(void *userdata, int sockfd, int backlog);
	int (*accept)(void *userdata, int sockfd, struct sockaddr *addr, socklen_t *addrlen);
	int (*connect)(void *userdata, int sockfd, const struct sockaddr *addr, socklen_t addrlen);
	ssize_t (*read)(void *userdata, int fd, void *buf, size_t count);
	ssize_t (*readv)(void *userdata, int fd, const struct iovec *iov, int iovcnt);
	ssize_t (*recv)(void *userdata, int sockfd, void *buf, size_t len, int flags);
	ssize_t (*recvfrom)(void *userdata, int sockfd, void *buf, size_t len, int flags,
			    struct sockaddr *src_addr, socklen_t *addrlen);
	ssize_t (*recvmsg)(void *userdata, int sockfd, struct msghdr *msg, int flags);
	ssize_t (*write)(void *userdata, int fd, const void *buf, size_t count);
	ssize_t (*writev)(void *userdata, int fd, const struct iovec *iov, int iovcnt);
	ssize_t (*send)(void *userdata, int sockfd, const void *buf, size_t len, int flags);
	ssize_t (*sendto)(void *userdata, int sockfd, const void *buf, size_t len, int flags,
			  const struct sockaddr *dest_addr, socklen_t addrlen);
	ssize_t (*sendmsg)(void *userdata, int sockfd, const struct msghdr *msg, int flags);
	int (*fcntl)(void *userdata, int fd, int cmd, ...);
	int (*ioctl)(void *userdata, int fd, unsigned long request, ...);
	int (*close)(void *userdata, int fd);
	int (*shutdown)(void *userdata, int sockfd, int how);
	int (*getsockopt)(void *userdata, int sockfd, int level, int optname, void *optval,
			  socklen_t *optlen);
	int (*setsockopt)(void *userdata, int sockfd, int level, int optname, const void *optval,
			  socklen_t optlen);
	int (*poll)(void *userdata, struct pollfd *fds, nfds_t nfds, int timeout);
	int (*netdev_send)(void *userdata, const void *buf, size_t count);
	int (*netdev_receive)(void *userdata, void *buf, size_t *count, long long *time_usecs);
	int (*usleep)(void *userdata, useconds_t usec);
	int (*gettimeofday)(void *userdata, struct timeval *tv, struct timezone *tz);
	int (*epoll_create)(void *userdata, int size);
	int (*epoll_ctl)(void *userdata, int epfd, int op, int fd, struct epoll_event *event);
	int (*epoll_wait)(void *userdata, int epfd, struct epoll_event *events, int maxevents,
			  int timeout);
	int (*pipe)(void *userdata, int pipefd[2]);
	int (*splice)(void *userdata, int fd_in, loff_t *off_in, int fd_out, loff_t *off_out,
		      size_t len, unsigned int flags);
};

typedef void (*packetdrill_interface_init_t)(const char *flags, struct packetdrill_interface *);

static struct packetdrill_interface *P;
static int checks;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		checks++;                                                             \
		if (!(cond)) {                                                        \
			fprintf(stderr, "driver: %s:%d: check failed: %s (errno %d %s)\n", \
				__FILE__, __LINE__, #cond, errno, strerror(errno));   \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

/* ------------------------------------------------------------ packets */

#define LOCAL_IP "192.168.0.1" /* packetdrill's default local address */
#define REMOTE_IP "192.0.2.1"  /* packetdrill's default remote address */

#define F_FIN 0x01
#define F_SYN 0x02
#define F_RST 0x04
#define F_PSH 0x08
#define F_ACK 0x10

static uint32_t sum16(const uint8_t *p, size_t n, uint32_t sum)
{
	for (size_t i = 0; i + 1 < n; i += 2)
		sum += (uint32_t)p[i] << 8 | p[i + 1];
	if (n & 1)
		sum += (uint32_t)p[n - 1] << 8;
	return sum;
}

static uint16_t fold(uint32_t sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

static uint16_t tcp_csum(const uint8_t *ip, const uint8_t *tcp, size_t tcp_len)
{
	uint8_t pseudo[12];
	memcpy(pseudo, ip + 12, 8);
	pseudo[8] = 0;
	pseudo[9] = 6;
	pseudo[10] = tcp_len >> 8;
	pseudo[11] = tcp_len & 0xff;
	return fold(sum16(tcp, tcp_len, sum16(pseudo, 12, 0)));
}

static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v & 0xff; }
static void put32(uint8_t *p, uint32_t v) { put16(p, v >> 16); put16(p + 2, v & 0xffff); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)get16(p) << 16 | get16(p + 2); }

/* An IPv4/TCP packet from the remote end to the stack; `mss` 0 = no options, else
 * <mss N,nop,wscale 7>. */
static size_t build(uint8_t *buf, uint16_t sport, uint16_t dport, uint32_t seq, uint32_t ack,
		    uint8_t flags, uint16_t win, uint16_t mss, const void *data, size_t len)
{
	size_t opt = mss ? 8 : 0, thl = 20 + opt, total = 20 + thl + len;
	memset(buf, 0, total);
	buf[0] = 0x45;
	put16(buf + 2, (uint16_t)total);
	put16(buf + 4, 0x1234);
	buf[8] = 64;
	buf[9] = 6;
	inet_pton(AF_INET, REMOTE_IP, buf + 12);
	inet_pton(AF_INET, LOCAL_IP, buf + 16);
	put16(buf + 10, fold(sum16(buf, 20, 0)));
	uint8_t *t = buf + 20;
	put16(t, sport);
	put16(t + 2, dport);
	put32(t + 4, seq);
	put32(t + 8, ack);
	t[12] = (uint8_t)(thl / 4) << 4;
	t[13] = flags;
	put16(t + 14, win);
	if (mss) {
		t[20] = 2;
		t[21] = 4;
		put16(t + 22, mss);
		t[24] = 1;
		t[25] = 3;
		t[26] = 3;
		t[27] = 7;
	}
	if (len)
		memcpy(t + thl, data, len);
	put16(t + 16, tcp_csum(buf, t, thl + len));
	return total;
}

struct seg {
	uint16_t sport, dport, win;
	uint32_t seq, ack;
	uint8_t flags;
	const uint8_t *data;
	size_t len;
	long long t_us;
};

static uint8_t rx[65536];

/* netdev_receive, then check the IPv4 and TCP headers and both checksums. */
static struct seg sniff(void)
{
	struct seg s;
	size_t n = sizeof(rx);
	long long t = 0;
	int tries = 0;
	/* packetdrill calls again when nothing was there; so do we, a few times. */
	while (P->netdev_receive(P->userdata, rx, &n, &t) != 0) {
		CHECK(++tries < 20);
		n = sizeof(rx);
	}
	CHECK(n >= 40);
	CHECK(rx[0] == 0x45);
	CHECK(get16(rx + 2) == n);
	CHECK(rx[9] == 6);
	CHECK(fold(sum16(rx, 20, 0)) == 0);
	char src[32], dst[32];
	inet_ntop(AF_INET, rx + 12, src, sizeof(src));
	inet_ntop(AF_INET, rx + 16, dst, sizeof(dst));
	CHECK(strcmp(src, LOCAL_IP) == 0);
	CHECK(strcmp(dst, REMOTE_IP) == 0);
	const uint8_t *tcp = rx + 20;
	size_t tlen = n - 20, thl = (size_t)(tcp[12] >> 4) * 4;
	CHECK(thl >= 20 && thl <= tlen);
	CHECK(tcp_csum(rx, tcp, tlen) == 0);
	s.sport = get16(tcp);
	s.dport = get16(tcp + 2);
	s.seq = get32(tcp + 4);
	s.ack = get32(tcp + 8);
	s.flags = tcp[13];
	s.win = get16(tcp + 14);
	s.data = tcp + thl;
	s.len = tlen - thl;
	s.t_us = t;
	return s;
}

static void inject(const uint8_t *pkt, size_t n)
{
	CHECK(P->netdev_send(P->userdata, pkt, n) == 0);
}

static long long now_us(void)
{
	struct timeval tv;
	CHECK(P->gettimeofday(P->userdata, &tv, NULL) == 0);
	return (long long)tv.tv_sec * 1000000 + tv.tv_usec;
}

static struct sockaddr_in sin_of(const char *ip, uint16_t port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

/* ------------------------------------------------------------ scripts */

/* Passive open, data both ways, orderly close initiated by the stack. */
static void passive(void)
{
	uint8_t pkt[2048];
	void *u = P->userdata;
	int one = 1;

	/* 0 socket(..., SOCK_STREAM, IPPROTO_TCP) = 3 */
	int lfd = P->socket(u, AF_INET, SOCK_STREAM, IPPROTO_TCP);
	/* Descriptor numbers are real kernel descriptors (packetdrill close()s them). */
	CHECK(lfd > 2 && fcntl(lfd, F_GETFD) >= 0);
	/* +0 setsockopt(3, SOL_SOCKET, SO_REUSEADDR, [1], 4) = 0 */
	CHECK(P->setsockopt(u, lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0);
	/* +0 bind(3, ..., ...) = 0 ; +0 listen(3, 1) = 0 */
	struct sockaddr_in a = sin_of(LOCAL_IP, 8080);
	CHECK(P->bind(u, lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CHECK(P->listen(u, lfd, 1) == 0);
	/* a non-blocking accept has nothing yet */
	CHECK(P->fcntl(u, lfd, F_SETFL, O_NONBLOCK) == 0);
	CHECK(P->fcntl(u, lfd, F_GETFL) & O_NONBLOCK);
	CHECK(P->accept(u, lfd, NULL, NULL) == -1 && errno == EAGAIN);
	CHECK(P->fcntl(u, lfd, F_SETFL, 0) == 0);

	/* +0 < S 0:0(0) win 32792 <mss 1000,nop,wscale 7> */
	long long t0 = now_us();
	inject(pkt, build(pkt, 40000, 8080, 1000, 0, F_SYN, 32792, 1000, NULL, 0));
	/* +0 > S. 0:0(0) ack 1 <...> */
	struct seg s = sniff();
	CHECK(s.flags == (F_SYN | F_ACK));
	CHECK(s.sport == 8080 && s.dport == 40000);
	CHECK(s.ack == 1001);
	CHECK(s.len == 0);
	CHECK(s.t_us >= t0 && s.t_us - t0 < 1000); /* at once, in virtual time */
	uint32_t isn = s.seq;

	/* +.1 < . 1:1(0) ack 1 win 32792 */
	CHECK(P->usleep(u, 100000) == 0);
	CHECK(now_us() - t0 >= 100000);
	inject(pkt, build(pkt, 40000, 8080, 1001, isn + 1, F_ACK, 32792, 0, NULL, 0));

	/* +0 accept(3, ..., ...) = 4 */
	struct sockaddr_in peer;
	socklen_t plen = sizeof(peer);
	int fd = P->accept(u, lfd, (struct sockaddr *)&peer, &plen);
	CHECK(fd > 2 && fd != lfd && fcntl(fd, F_GETFD) >= 0);
	CHECK(plen == sizeof(peer));
	CHECK(peer.sin_family == AF_INET && ntohs(peer.sin_port) == 40000);
	char ip[32];
	inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
	CHECK(strcmp(ip, REMOTE_IP) == 0);
	int v = 0;
	socklen_t vl = sizeof(v);
	CHECK(P->getsockopt(u, fd, SOL_SOCKET, SO_ERROR, &v, &vl) == 0 && v == 0);
	CHECK(P->setsockopt(u, fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0);
	vl = sizeof(v);
	CHECK(P->getsockopt(u, fd, IPPROTO_TCP, TCP_NODELAY, &v, &vl) == 0 && v == 1);

	/* +0 write(4, ..., 17) = 17 ; +0 > P. 1:18(17) ack 1 */
	static const char hello[] = "hello packetdrill";
	CHECK(P->write(u, fd, hello, 17) == 17);
	s = sniff();
	CHECK(s.flags == (F_PSH | F_ACK));
	CHECK(s.seq == isn + 1 && s.ack == 1001);
	CHECK(s.len == 17 && memcmp(s.data, hello, 17) == 0);

	/* +0 < P. 1:6(5) ack 18 win 32792 ; the stack ACKs it */
	inject(pkt, build(pkt, 40000, 8080, 1001, isn + 18, F_PSH | F_ACK, 32792, 0, "ping!", 5));
	int avail = -1;
	CHECK(P->ioctl(u, fd, FIONREAD, &avail) == 0 && avail == 5);
	char buf[64];
	struct pollfd pfd = {.fd = fd, .events = POLLIN | POLLOUT};
	CHECK(P->poll(u, &pfd, 1, 0) == 1 && (pfd.revents & POLLIN) && (pfd.revents & POLLOUT));
	CHECK(P->read(u, fd, buf, sizeof(buf)) == 5 && memcmp(buf, "ping!", 5) == 0);
	s = sniff();
	CHECK(s.flags == F_ACK && s.seq == isn + 18 && s.ack == 1006 && s.len == 0);

	/* writev and readv */
	struct iovec wv[2] = {{(void *)"ab", 2}, {(void *)"cde", 3}};
	CHECK(P->writev(u, fd, wv, 2) == 5);
	s = sniff();
	CHECK(s.seq == isn + 18 && s.len == 5 && memcmp(s.data, "abcde", 5) == 0);
	inject(pkt, build(pkt, 40000, 8080, 1006, isn + 23, F_PSH | F_ACK, 32792, 0, "xyz", 3));
	char r1[1], r2[8];
	struct iovec rv[2] = {{r1, 1}, {r2, 8}};
	CHECK(P->readv(u, fd, rv, 2) == 3 && r1[0] == 'x' && memcmp(r2, "yz", 2) == 0);
	s = sniff();
	CHECK(s.flags == F_ACK && s.ack == 1009);
	/* nothing more to read on a non-blocking receive */
	CHECK(P->recv(u, fd, buf, sizeof(buf), MSG_DONTWAIT) == -1 && errno == EAGAIN);

	/* +0 close(4) = 0 ; +0 > F. 23:23(0) ack 9 */
	CHECK(P->close(u, fd) == 0);
	s = sniff();
	CHECK(s.flags == (F_FIN | F_ACK) && s.seq == isn + 23 && s.ack == 1009);
	/* +0 < F. 9:9(0) ack 24 ; +0 > . 24:24(0) ack 10 */
	inject(pkt, build(pkt, 40000, 8080, 1009, isn + 24, F_FIN | F_ACK, 32792, 0, NULL, 0));
	s = sniff();
	CHECK(s.flags == F_ACK && s.seq == isn + 24 && s.ack == 1010);
	CHECK(P->close(u, lfd) == 0);
	CHECK(P->close(u, lfd) == -1 && errno == EBADF);
	CHECK(fcntl(lfd, F_GETFD) == -1 && errno == EBADF);
}

/* Active open with a non-blocking connect, SYN retransmission in virtual time,
 * then a reset. */
static void active(void)
{
	uint8_t pkt[2048];
	void *u = P->userdata;

	int fd = P->socket(u, AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(fd >= 3);
	struct sockaddr_in a = sin_of(REMOTE_IP, 9000);
	CHECK(P->connect(u, fd, (struct sockaddr *)&a, sizeof(a)) == -1 && errno == EINPROGRESS);
	struct seg s = sniff();
	CHECK(s.flags == F_SYN && s.dport == 9000 && s.ack == 0);
	uint32_t isn = s.seq;
	uint16_t port = s.sport;
	long long t1 = s.t_us;
	/* no answer: the SYN is sent again after the initial RTO (1 s), in virtual time */
	s = sniff();
	CHECK(s.flags == F_SYN && s.seq == isn && s.sport == port);
	CHECK(s.t_us - t1 >= 900000 && s.t_us - t1 <= 3100000);

	struct pollfd pfd = {.fd = fd, .events = POLLOUT};
	CHECK(P->poll(u, &pfd, 1, 0) == 0);
	/* < S. 0:0(0) ack 1 win 5792 <mss 1200,nop,wscale 7> ; > . 1:1(0) ack 1 */
	inject(pkt, build(pkt, 9000, port, 7000, isn + 1, F_SYN | F_ACK, 5792, 1200, NULL, 0));
	s = sniff();
	CHECK(s.flags == F_ACK && s.seq == isn + 1 && s.ack == 7001);
	CHECK(P->poll(u, &pfd, 1, 0) == 1 && (pfd.revents & POLLOUT));
	int v = -1;
	socklen_t vl = sizeof(v);
	CHECK(P->getsockopt(u, fd, SOL_SOCKET, SO_ERROR, &v, &vl) == 0 && v == 0);
	vl = sizeof(v);
	CHECK(P->getsockopt(u, fd, IPPROTO_TCP, TCP_MAXSEG, &v, &vl) == 0 && v > 0 && v <= 1200);

	/* send() then an RST from the peer: the next read reports ECONNRESET */
	CHECK(P->send(u, fd, "q", 1, 0) == 1);
	s = sniff();
	CHECK(s.len == 1 && s.data[0] == 'q');
	inject(pkt, build(pkt, 9000, port, 7001, 0, F_RST, 0, 0, NULL, 0));
	char buf[8];
	CHECK(P->read(u, fd, buf, sizeof(buf)) == -1 && errno == ECONNRESET);
	CHECK(P->close(u, fd) == 0);
}

/* A SYN to a closed port gets RST/ACK; bad calls fail with errno, not a crash. */
static void refused(void)
{
	uint8_t pkt[2048];
	void *u = P->userdata;
	inject(pkt, build(pkt, 41000, 1234, 5, 0, F_SYN, 1000, 0, NULL, 0));
	struct seg s = sniff();
	CHECK(s.flags == (F_RST | F_ACK) && s.ack == 6 && s.sport == 1234);
	CHECK(P->socket(u, AF_UNIX, SOCK_STREAM, 0) == -1 && errno == EAFNOSUPPORT);
	/* UDP and raw ICMP are the socket layer's too; other raw sockets are not. */
	int us = P->socket(u, AF_INET, SOCK_DGRAM, 0);
	CHECK(us >= 0 && P->close(u, us) == 0);
	int raw = P->socket(u, AF_INET, SOCK_RAW, IPPROTO_ICMP);
	CHECK(raw >= 0 && P->close(u, raw) == 0);
	CHECK(P->socket(u, AF_INET, SOCK_RAW, IPPROTO_UDP) == -1 && errno == EPROTONOSUPPORT);
	CHECK(P->read(u, 99, pkt, 1) == -1 && errno == EBADF);
	CHECK(P->netdev_send(u, "\x10", 1) == -1);
	int ep = P->epoll_create(u, 1);
	CHECK(ep >= 0);
	CHECK(P->epoll_create(u, 0) == -1 && errno == EINVAL);
	CHECK(P->epoll_ctl(u, ep, EPOLL_CTL_ADD, 99, NULL) == -1 && errno == EBADF);
	CHECK(P->close(u, ep) == 0);
	int fds[2] = {-1, -1};
	int r = P->pipe(u, fds);
	if (r != 0)
		fprintf(stderr, "driver: pipe: %d errno %d\n", r, errno);
	CHECK(r == 0 && fds[0] >= 0 && fds[1] >= 0);
	CHECK(write(fds[1], "x", 1) == 1);
	CHECK(P->close(u, fds[0]) == 0 && P->close(u, fds[1]) == 0);
	CHECK(P->close(u, fds[0]) == -1 && errno == EBADF);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s <backend.so>\n", argv[0]);
		return 2;
	}
	/* Exactly as packetdrill's so_instance_init. */
	void *handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE | RTLD_DEEPBIND);
	if (!handle) {
		fprintf(stderr, "driver: %s\n", dlerror());
		return 1;
	}
	dlerror();
	packetdrill_interface_init_t init =
		(packetdrill_interface_init_t)dlsym(handle, "packetdrill_interface_init");
	char *error = dlerror();
	if (error) {
		fprintf(stderr, "driver: %s\n", error);
		return 1;
	}
	size_t (*size)(void) = (size_t(*)(void))dlsym(handle, "usnet_packetdrill_interface_size");
	CHECK(size && size() == sizeof(struct packetdrill_interface));

	/* A bad flag string: userdata stays NULL, every pointer is still set. */
	struct packetdrill_interface *bad = calloc(1, sizeof(*bad));
	init("no_such_flag=1", bad);
	CHECK(bad->userdata == NULL && bad->socket && bad->free);
	CHECK(bad->socket(bad->userdata, AF_INET, SOCK_STREAM, 0) == -1);
	bad->free(bad->userdata);
	free(bad);

	P = calloc(1, sizeof(*P));
	init("", P);
	CHECK(P->userdata != NULL);
	void **fns = (void **)&P->free;
	for (size_t i = 0; i < sizeof(*P) / sizeof(void *) - 1; i++)
		CHECK(fns[i] != NULL);

	passive();
	active();
	refused();

	P->free(P->userdata);
	free(P);
	dlclose(handle);
	printf("driver: ok (%d checks)\n", checks);
	return 0;
}
