//! The stack as a [`usnet_socket_api::SocketApi`], so a service written against that trait
//! runs in a process's own poll loop (and, unchanged, as a stack server client).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use usnet_socket_api::{Handle, Readiness, SocketApi};

use crate::{SocketHandle, Stack, StackError};

fn io_err(e: StackError) -> io::Error {
    if e == StackError::WouldBlock {
        return io::ErrorKind::WouldBlock.into();
    }
    io::Error::from_raw_os_error(e.errno())
}

fn h(x: Handle) -> SocketHandle {
    SocketHandle::from_raw(x)
}

impl SocketApi for Stack {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now().as_nanos())
    }
    fn tcp_listen(&mut self, addr: SocketAddr, backlog: usize) -> io::Result<Handle> {
        Stack::tcp_listen(self, addr, backlog)
            .map(|x| x.raw())
            .map_err(io_err)
    }
    fn tcp_accept(&mut self, l: Handle) -> io::Result<Handle> {
        Stack::tcp_accept(self, h(l))
            .map(|x| x.raw())
            .map_err(io_err)
    }
    fn tcp_send(&mut self, x: Handle, data: &[u8]) -> io::Result<usize> {
        Stack::tcp_send(self, h(x), data).map_err(io_err)
    }
    fn tcp_recv(&mut self, x: Handle, buf: &mut [u8]) -> io::Result<usize> {
        Stack::tcp_recv(self, h(x), buf).map_err(io_err)
    }
    fn tcp_shutdown_write(&mut self, x: Handle) -> io::Result<()> {
        Stack::tcp_shutdown_write(self, h(x)).map_err(io_err)
    }
    fn tcp_set_nodelay(&mut self, x: Handle, on: bool) -> io::Result<()> {
        Stack::tcp_set_nodelay(self, h(x), on).map_err(io_err)
    }
    fn tcp_close(&mut self, x: Handle) -> io::Result<()> {
        Stack::tcp_close(self, h(x)).map_err(io_err)
    }
    fn tcp_abort(&mut self, x: Handle) -> io::Result<()> {
        Stack::tcp_abort(self, h(x)).map_err(io_err)
    }
    fn udp_bind(&mut self, addr: SocketAddr) -> io::Result<Handle> {
        Stack::udp_bind(self, addr).map(|x| x.raw()).map_err(io_err)
    }
    fn udp_send_to(&mut self, x: Handle, data: &[u8], to: SocketAddr) -> io::Result<usize> {
        Stack::udp_send_to(self, h(x), data, to).map_err(io_err)
    }
    fn udp_recv_from(&mut self, x: Handle, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        Stack::udp_recv_from(self, h(x), buf).map_err(io_err)
    }
    fn readiness(&self, x: Handle) -> io::Result<Readiness> {
        let r = Stack::readiness(self, h(x)).map_err(io_err)?;
        Ok(Readiness {
            readable: r.readable,
            writable: r.writable,
            closed: r.closed,
            connected: r.connected,
        })
    }
    fn close(&mut self, x: Handle) -> io::Result<()> {
        Stack::close(self, h(x)).map_err(io_err)
    }
}
