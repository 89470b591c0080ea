//! One connection's life, the same on every backend that moves bytes through calls
//! (`kernel`: a Linux socket; `socket`: usnet's byte-ring socket API): answers out
//! first, then input in, until the input runs dry or the send buffer is full; after
//! the last answer a FIN, then the input is read and dropped until the client
//! closes (or [`LINGER`] passes), so no RST destroys an answer still in flight.

use std::io;
use std::time::{Duration, Instant};

use crate::http::{Outq, RequestStream, Responses};
use crate::Stats;

/// How long a connection that sent its last answer waits for the client's FIN.
pub const LINGER: Duration = Duration::from_secs(2);

/// Reads one connection may do per visit before others get their turn.
pub const ROUNDS: usize = 8;

/// A connected socket's calls, non-blocking (`WouldBlock`: not now).
pub trait Transport {
    /// `Ok(0)`: the client closed its side.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    fn send(&mut self, data: &[u8]) -> io::Result<usize>;
    fn shutdown_write(&mut self) -> io::Result<()>;
}

/// What the backend does with the connection after a visit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Waiting for input.
    Idle,
    /// Answers wait for room in the send buffer: wake on writable.
    Blocked,
    /// Its turn's budget is used and it still has work: visit again soon.
    More,
    /// Finished (answers sent, FIN exchanged): close the socket.
    Done,
    /// Reset by the client or failed: close (abort) the socket.
    Failed,
}

/// Buffers a loop shares between its connections.
#[derive(Debug)]
pub struct Scratch {
    pub rx: Vec<u8>,
    pub tx: Vec<u8>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            rx: vec![0u8; 64 << 10],
            tx: Vec::new(),
        }
    }
}

/// One connection: the HTTP session, the answers owed and the closing state.
#[derive(Debug, Default)]
pub struct Conn {
    pub session: RequestStream,
    pub out: Outq,
    /// The client closed its side.
    eof: bool,
    /// FIN sent after the last answer: input is dropped until the client's FIN or
    /// this deadline.
    linger: Option<Instant>,
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted
}

impl Conn {
    /// The deadline of a connection that lingers.
    pub fn linger_deadline(&self) -> Option<Instant> {
        self.linger
    }

    /// Sends the answers owed: `Ok(true)` when all are out.
    fn flush(
        &mut self,
        t: &mut dyn Transport,
        resp: &Responses,
        scratch: &mut Vec<u8>,
        stats: &mut Stats,
    ) -> io::Result<bool> {
        while !self.out.is_empty() {
            let chunk = self.out.chunk(resp, scratch);
            match t.send(chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    stats.responses += self.out.advance(resp, n) as u64;
                    stats.tx_bytes += n as u64;
                }
                Err(e) if would_block(&e) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Does what can be done now.
    pub fn service(
        &mut self,
        t: &mut dyn Transport,
        resp: &Responses,
        scratch: &mut Scratch,
        stats: &mut Stats,
    ) -> Status {
        for _ in 0..ROUNDS {
            match self.flush(t, resp, &mut scratch.tx, stats) {
                Ok(true) => {}
                Ok(false) => return Status::Blocked,
                Err(_) => return self.failed(stats),
            }
            if self.session.is_closing() && self.linger.is_none() {
                if t.shutdown_write().is_err() {
                    return self.failed(stats);
                }
                self.linger = Some(Instant::now() + LINGER);
            }
            if self.eof {
                return Status::Done;
            }
            match t.recv(&mut scratch.rx) {
                Ok(0) => {
                    // Answers already owed still go out, then the FIN.
                    self.eof = true;
                    self.session.end_of_input();
                }
                Ok(n) => {
                    stats.rx_bytes += n as u64;
                    let before = (self.session.requests, self.session.errors);
                    self.session.feed(&scratch.rx[..n], &mut self.out);
                    stats.requests += self.session.requests - before.0;
                    stats.bad_requests += self.session.errors - before.1;
                }
                Err(e) if would_block(&e) => return Status::Idle,
                Err(_) => return self.failed(stats),
            }
        }
        // The budget is used: what the last read asked for goes out now.
        match self.flush(t, resp, &mut scratch.tx, stats) {
            Ok(true) => Status::More,
            Ok(false) => Status::Blocked,
            Err(_) => self.failed(stats),
        }
    }

    fn failed(&mut self, stats: &mut Stats) -> Status {
        stats.resets += 1;
        Status::Failed
    }
}
