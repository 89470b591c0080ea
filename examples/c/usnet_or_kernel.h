/* usnet_or_kernel.h - one switch between the kernel's sockets and usnet's.
 *
 * Build with -DUSE_USNET (and -lusnet) to run the program's sockets on a usnet stack
 * server (`usnet up`; USNET_STACK names it), without it on the kernel. */
#ifndef USNET_OR_KERNEL_H
#define USNET_OR_KERNEL_H

#include <sys/socket.h>
#include <unistd.h>
#include <poll.h>

#ifdef USE_USNET
#include "usnet.h"
#define S_SOCKET     usnet_socket
#define S_BIND       usnet_bind
#define S_LISTEN     usnet_listen
#define S_ACCEPT     usnet_accept
#define S_CONNECT    usnet_connect
#define S_READ       usnet_read
#define S_WRITE      usnet_write
#define S_SEND       usnet_send
#define S_RECV       usnet_recv
#define S_SHUTDOWN   usnet_shutdown
#define S_CLOSE      usnet_close
#define S_SETSOCKOPT usnet_setsockopt
#define S_GETSOCKOPT usnet_getsockopt
#define S_POLL       usnet_poll
#define S_FCNTL      usnet_fcntl
#define S_DUP        usnet_dup
#define S_DUP2       usnet_dup2
#define S_SENDFILE   usnet_sendfile
#define S_SENDTO     usnet_sendto
#define S_RECVFROM   usnet_recvfrom
#define S_GETSOCKNAME usnet_getsockname
#define S_GETPEERNAME usnet_getpeername
#define S_STACK      "usnet"
#else
#include <fcntl.h>
#include <sys/sendfile.h>
#define S_SOCKET     socket
#define S_BIND       bind
#define S_LISTEN     listen
#define S_ACCEPT     accept
#define S_CONNECT    connect
#define S_READ       read
#define S_WRITE      write
#define S_SEND       send
#define S_RECV       recv
#define S_SHUTDOWN   shutdown
#define S_CLOSE      close
#define S_SETSOCKOPT setsockopt
#define S_GETSOCKOPT getsockopt
#define S_POLL       poll
#define S_FCNTL      fcntl
#define S_DUP        dup
#define S_DUP2       dup2
#define S_SENDFILE   sendfile
#define S_SENDTO     sendto
#define S_RECVFROM   recvfrom
#define S_GETSOCKNAME getsockname
#define S_GETPEERNAME getpeername
#define S_STACK      "kernel"
#endif

#endif
