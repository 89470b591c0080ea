/* inet_checksum.h - the Internet checksum (RFC 1071), for the test programs that
 * build or check ICMP messages themselves. */
#ifndef USNET_INET_CHECKSUM_H
#define USNET_INET_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* The Internet checksum of `n` bytes (0 when a message's own checksum is right). */
static uint16_t checksum(const unsigned char *p, size_t n) {
    uint32_t sum = 0;
    for (size_t i = 0; i + 1 < n; i += 2)
        sum += (uint32_t)p[i] << 8 | p[i + 1];
    if (n & 1)
        sum += (uint32_t)p[n - 1] << 8;
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

#endif
