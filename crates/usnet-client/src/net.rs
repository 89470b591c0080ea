//! A client session as a [`usnet_socket_api::SocketApi`]: a table of non-blocking sockets
//! named by handles, so a service written against that trait (echo, HTTP...) runs as
//! an ordinary client of a stack server, and an idle wait on the session's bell.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use usnet_session_abi::{slot, FLAG_ACCEPTABLE, FLAG_CONNECTED, FLAG_ERROR, FLAG_HUP, FLAG_RX_EOF};
use usnet_socket_api::{errno, Handle, Readiness, SocketApi};

use crate::sock::ClientSocket;
use crate::{Client, TcpListener, TcpStream, UdpSocket};

enum Entry {
    Listener(TcpListener),
    Stream(TcpStream),
    Udp(UdpSocket),
}

impl Entry {
    fn sock(&self) -> &ClientSocket {
        match self {
            Entry::Listener(l) => &l.sock,
            Entry::Stream(s) => &s.sock,
            Entry::Udp(u) => &u.sock,
        }
    }
}

/// Non-blocking sockets of one client, by handle.
pub struct ClientNet {
    client: Client,
    table: Vec<Option<Entry>>,
    gens: Vec<u32>,
    free: Vec<usize>,
    epoch: Instant,
}

fn ebadf() -> io::Error {
    io::Error::from_raw_os_error(errno::EBADF)
}

impl ClientNet {
    pub fn new(client: Client) -> ClientNet {
        ClientNet {
            client,
            table: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            epoch: Instant::now(),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    fn insert(&mut self, e: Entry) -> Handle {
        e.sock().set_nonblocking(true);
        let i = match self.free.pop() {
            Some(i) => {
                self.table[i] = Some(e);
                i
            }
            None => {
                self.table.push(Some(e));
                self.gens.push(0);
                self.table.len() - 1
            }
        };
        ((self.gens[i] as u64) << 32) | i as u64
    }

    fn get(&self, h: Handle) -> io::Result<&Entry> {
        let i = (h & 0xffff_ffff) as usize;
        match self.table.get(i) {
            Some(Some(e)) if self.gens[i] == (h >> 32) as u32 => Ok(e),
            _ => Err(ebadf()),
        }
    }

    fn remove(&mut self, h: Handle) -> io::Result<Entry> {
        self.get(h)?;
        let i = (h & 0xffff_ffff) as usize;
        self.gens[i] = self.gens[i].wrapping_add(1);
        self.free.push(i);
        Ok(self.table[i].take().expect("checked"))
    }

    fn stream(&self, h: Handle) -> io::Result<&TcpStream> {
        match self.get(h)? {
            Entry::Stream(s) => Ok(s),
            _ => Err(io::Error::from_raw_os_error(errno::ENOTSOCK)),
        }
    }

    /// The session bell's sequence: read it before a pass over the sockets and give
    /// it to [`ClientNet::wait`], so a change during the pass ends the wait at once.
    pub fn seq(&self) -> u32 {
        self.client.conn.bell_seq()
    }

    /// Sleeps until the server changes anything in this session (or `timeout`).
    pub fn wait(&self, seen: u32, timeout: Duration) -> io::Result<()> {
        self.client.conn.sleep_bell(seen, timeout)
    }
}

impl SocketApi for ClientNet {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn tcp_listen(&mut self, addr: SocketAddr, backlog: usize) -> io::Result<Handle> {
        let l = TcpListener::bind_with_backlog(&self.client, addr, backlog)?;
        Ok(self.insert(Entry::Listener(l)))
    }

    fn tcp_accept(&mut self, listener: Handle) -> io::Result<Handle> {
        let s = match self.get(listener)? {
            Entry::Listener(l) => {
                if !l.acceptable() {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                l.accept()?.0
            }
            _ => return Err(io::Error::from_raw_os_error(errno::EINVAL)),
        };
        Ok(self.insert(Entry::Stream(s)))
    }

    fn tcp_send(&mut self, h: Handle, data: &[u8]) -> io::Result<usize> {
        use std::io::Write;
        (&mut self.stream(h)?).write(data)
    }

    fn tcp_recv(&mut self, h: Handle, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        (&mut self.stream(h)?).read(buf)
    }

    fn tcp_shutdown_write(&mut self, h: Handle) -> io::Result<()> {
        self.stream(h)?.shutdown(std::net::Shutdown::Write)
    }

    fn tcp_set_nodelay(&mut self, h: Handle, on: bool) -> io::Result<()> {
        self.stream(h)?.set_nodelay(on)
    }

    fn tcp_close(&mut self, h: Handle) -> io::Result<()> {
        self.remove(h).map(drop)
    }

    fn tcp_abort(&mut self, h: Handle) -> io::Result<()> {
        if let Entry::Stream(s) = self.get(h)? {
            let _ = s.set_linger(Some(Duration::ZERO));
        }
        self.remove(h).map(drop)
    }

    fn udp_bind(&mut self, addr: SocketAddr) -> io::Result<Handle> {
        let u = UdpSocket::bind(&self.client, addr)?;
        Ok(self.insert(Entry::Udp(u)))
    }

    fn udp_send_to(&mut self, h: Handle, data: &[u8], to: SocketAddr) -> io::Result<usize> {
        match self.get(h)? {
            Entry::Udp(u) => u.send_to(data, to),
            _ => Err(io::Error::from_raw_os_error(errno::ENOTSOCK)),
        }
    }

    fn udp_recv_from(&mut self, h: Handle, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        match self.get(h)? {
            Entry::Udp(u) => u.recv_from(buf),
            _ => Err(io::Error::from_raw_os_error(errno::ENOTSOCK)),
        }
    }

    fn readiness(&self, h: Handle) -> io::Result<Readiness> {
        let s = self.get(h)?.sock();
        let f = s.word(slot::FLAGS);
        let closed = f & (FLAG_HUP | FLAG_ERROR) != 0;
        let listener = matches!(self.get(h)?, Entry::Listener(_));
        let udp = matches!(self.get(h)?, Entry::Udp(_));
        Ok(Readiness {
            readable: s.rx_ready() > 0 || f & (FLAG_RX_EOF | FLAG_ACCEPTABLE) != 0 || closed,
            writable: closed
                || (!listener && (udp || f & FLAG_CONNECTED != 0) && s.tx_send_room(f)),
            closed,
            connected: f & FLAG_CONNECTED != 0,
        })
    }

    fn close(&mut self, h: Handle) -> io::Result<()> {
        self.remove(h).map(drop)
    }
}
