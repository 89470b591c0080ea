/* Interface queries on sockets (SIOCGIF*), as programs make them to list the
 * host's interfaces (dnsmasq, daemons that pick an address to announce): the same
 * answers on a UDP and a TCP socket under the shim as on the kernel.
 *
 *   ifaces ADDR PORT        (the address and port are not used; the harness passes them)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

static int failed;

static void check(int ok, const char *what) {
    printf("%s: %s\n", what, ok ? "ok" : "FAILED");
    failed |= !ok;
}

static void queries(int s, const char *kind) {
    char what[128];
    struct ifreq r;
    memset(&r, 0, sizeof r);
    strcpy(r.ifr_name, "lo");
    int ok = ioctl(s, SIOCGIFINDEX, &r) == 0;
    int index = r.ifr_ifindex;
    snprintf(what, sizeof what, "%s: SIOCGIFINDEX lo is %d", kind, ok ? index : -1);
    check(ok && index > 0, what);

    memset(&r, 0, sizeof r);
    r.ifr_ifindex = index;
    ok = ioctl(s, SIOCGIFNAME, &r) == 0;
    snprintf(what, sizeof what, "%s: SIOCGIFNAME %d is %s", kind, index, ok ? r.ifr_name : "?");
    check(ok && strcmp(r.ifr_name, "lo") == 0, what);

    memset(&r, 0, sizeof r);
    strcpy(r.ifr_name, "lo");
    ok = ioctl(s, SIOCGIFFLAGS, &r) == 0;
    snprintf(what, sizeof what, "%s: SIOCGIFFLAGS lo says loopback and up", kind);
    check(ok && (r.ifr_flags & IFF_LOOPBACK) && (r.ifr_flags & IFF_UP), what);

    memset(&r, 0, sizeof r);
    strcpy(r.ifr_name, "lo");
    ok = ioctl(s, SIOCGIFMTU, &r) == 0;
    snprintf(what, sizeof what, "%s: SIOCGIFMTU lo is %d", kind, ok ? r.ifr_mtu : -1);
    check(ok && r.ifr_mtu > 0, what);

    memset(&r, 0, sizeof r);
    strcpy(r.ifr_name, "lo");
    ok = ioctl(s, SIOCGIFADDR, &r) == 0;
    struct sockaddr_in *a = (struct sockaddr_in *)&r.ifr_addr;
    snprintf(what, sizeof what, "%s: SIOCGIFADDR lo is %s", kind,
             ok ? inet_ntoa(a->sin_addr) : "?");
    check(ok && a->sin_addr.s_addr == htonl(INADDR_LOOPBACK), what);

    memset(&r, 0, sizeof r);
    strcpy(r.ifr_name, "no-such-if0");
    errno = 0;
    ok = ioctl(s, SIOCGIFINDEX, &r) == -1 && errno == ENODEV;
    snprintf(what, sizeof what, "%s: SIOCGIFINDEX of a missing interface fails with ENODEV", kind);
    check(ok, what);

    struct ifreq list[64];
    struct ifconf c = {.ifc_len = sizeof list, .ifc_req = list};
    ok = ioctl(s, SIOCGIFCONF, &c) == 0;
    int n = ok ? c.ifc_len / (int)sizeof(struct ifreq) : 0, lo = 0;
    for (int i = 0; i < n; i++)
        lo |= strcmp(list[i].ifr_name, "lo") == 0;
    snprintf(what, sizeof what, "%s: SIOCGIFCONF lists lo", kind);
    check(ok && lo, what);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    int t = socket(AF_INET, SOCK_STREAM, 0);
    queries(u, "udp");
    queries(t, "tcp");
    close(u);
    close(t);
    if (failed) return 1;
    printf("all ok\n");
    return 0;
}
