/* check.h - the test programs' one check: prints "ok NAME" or "FAIL NAME (errno ...)"
 * and counts failures, so a run on the kernel and one on usnet can be compared line
 * for line. */
#ifndef USNET_CHECK_H
#define USNET_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int failures;
#define CHECK(name, cond)                                                           \
    do {                                                                            \
        if (cond) {                                                                 \
            printf("ok %s\n", name);                                                \
        } else {                                                                    \
            printf("FAIL %s (errno %d %s)\n", name, errno, strerror(errno));        \
            failures++;                                                             \
        }                                                                           \
        fflush(stdout);                                                             \
    } while (0)

#endif
