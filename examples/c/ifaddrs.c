/* The interface that carries ADDR, as a program finds it: getifaddrs, the
 * if_* name calls and the SIOCGIF* ioctls must tell one story (name, index,
 * flags, address, netmask, broadcast, MAC, MTU). On the kernel ADDR is
 * 127.0.0.1 (lo); under the shim the stack's address, whose interface is the
 * stack's, not one of the host's.
 *
 *   ifaddrs ADDR PORT   (PORT unused)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    struct in_addr want;
    if (inet_pton(AF_INET, argv[1], &want) != 1)
        return 2;
    /* A socket first: under the shim, the one its ioctls go through. */
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK("socket", s >= 0);

    struct ifaddrs *list = NULL;
    CHECK("getifaddrs", getifaddrs(&list) == 0 && list != NULL);
    char name[IF_NAMESIZE] = "";
    struct in_addr mask = {0}, bcast = {0};
    unsigned flags = 0;
    for (struct ifaddrs *i = list; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == want.s_addr) {
            snprintf(name, sizeof name, "%s", i->ifa_name);
            mask = ((struct sockaddr_in *)i->ifa_netmask)->sin_addr;
            if (i->ifa_broadaddr && (i->ifa_flags & IFF_BROADCAST))
                bcast = ((struct sockaddr_in *)i->ifa_broadaddr)->sin_addr;
            flags = i->ifa_flags;
        }
    CHECK("an interface carries the address", name[0] != 0);
    CHECK("it is up and running", (flags & (IFF_UP | IFF_RUNNING)) == (IFF_UP | IFF_RUNNING));
    /* Its link entry: the index and the MAC. */
    int ll_index = 0;
    unsigned char mac[6] = {0};
    int ll_entries = 0;
    for (struct ifaddrs *i = list; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_PACKET && strcmp(i->ifa_name, name) == 0) {
            struct sockaddr_ll *l = (struct sockaddr_ll *)i->ifa_addr;
            ll_index = l->sll_ifindex;
            memcpy(mac, l->sll_addr, 6);
            ll_entries++;
        }
    CHECK("one link entry names its index", ll_entries == 1 && ll_index > 0);

    /* The name calls. */
    unsigned idx = if_nametoindex(name);
    CHECK("if_nametoindex gives the link entry's index", (int)idx == ll_index);
    char back[IF_NAMESIZE] = "";
    CHECK("if_indextoname gives the name back",
          if_indextoname(idx, back) == back && strcmp(back, name) == 0);
    struct if_nameindex *ni = if_nameindex();
    int listed = 0;
    for (struct if_nameindex *p = ni; p && (p->if_index || p->if_name); p++)
        if (p->if_index == idx && strcmp(p->if_name, name) == 0)
            listed = 1;
    CHECK("if_nameindex lists it", listed);
    if_freenameindex(ni);

    /* The ioctls, on the socket. */
    struct ifreq r;
    memset(&r, 0, sizeof r);
    snprintf(r.ifr_name, sizeof r.ifr_name, "%s", name);
    CHECK("SIOCGIFINDEX", ioctl(s, SIOCGIFINDEX, &r) == 0 && r.ifr_ifindex == (int)idx);
    memset(&r.ifr_ifru, 0, sizeof r.ifr_ifru);
    r.ifr_ifindex = idx;
    char keep[IF_NAMESIZE];
    memcpy(keep, r.ifr_name, sizeof keep);
    memset(r.ifr_name, 0, sizeof r.ifr_name);
    CHECK("SIOCGIFNAME", ioctl(s, SIOCGIFNAME, &r) == 0 && strcmp(r.ifr_name, name) == 0);
    memcpy(r.ifr_name, keep, sizeof keep);
    CHECK("SIOCGIFFLAGS", ioctl(s, SIOCGIFFLAGS, &r) == 0 &&
                              (r.ifr_flags & 0xffff) == (short)(flags & 0xffff));
    CHECK("SIOCGIFADDR",
          ioctl(s, SIOCGIFADDR, &r) == 0 &&
              ((struct sockaddr_in *)&r.ifr_addr)->sin_addr.s_addr == want.s_addr);
    CHECK("SIOCGIFNETMASK",
          ioctl(s, SIOCGIFNETMASK, &r) == 0 &&
              ((struct sockaddr_in *)&r.ifr_netmask)->sin_addr.s_addr == mask.s_addr);
    if (flags & IFF_BROADCAST)
        CHECK("SIOCGIFBRDADDR",
              ioctl(s, SIOCGIFBRDADDR, &r) == 0 &&
                  ((struct sockaddr_in *)&r.ifr_broadaddr)->sin_addr.s_addr == bcast.s_addr);
    else
        CHECK("SIOCGIFBRDADDR", 1);
    CHECK("SIOCGIFMTU", ioctl(s, SIOCGIFMTU, &r) == 0 && r.ifr_mtu >= 576);
    CHECK("SIOCGIFHWADDR: the link entry's MAC",
          ioctl(s, SIOCGIFHWADDR, &r) == 0 && memcmp(r.ifr_hwaddr.sa_data, mac, 6) == 0);
    /* SIOCGIFCONF: the length first, then the entries, the address among them. */
    struct ifconf c = {.ifc_len = 0, .ifc_buf = NULL};
    CHECK("SIOCGIFCONF says how long", ioctl(s, SIOCGIFCONF, &c) == 0 && c.ifc_len > 0);
    int len = c.ifc_len;
    struct ifreq *all = calloc(1, len);
    c.ifc_len = len;
    c.ifc_req = all;
    int found = 0;
    if (ioctl(s, SIOCGIFCONF, &c) == 0)
        for (int k = 0; k < c.ifc_len / (int)sizeof(struct ifreq); k++)
            if (strcmp(all[k].ifr_name, name) == 0 &&
                ((struct sockaddr_in *)&all[k].ifr_addr)->sin_addr.s_addr == want.s_addr)
                found = 1;
    CHECK("SIOCGIFCONF lists the address on it", found && c.ifc_len == len);
    free(all);
    freeifaddrs(list);
    close(s);
    if (failures == 0)
        printf("all ok\n");
    return failures ? 1 : 0;
}
