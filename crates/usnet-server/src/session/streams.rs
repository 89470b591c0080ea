//! Bytes between a slot's rings and its stack socket: the send ring drained into the
//! stack (stream bytes, or UDP records), received bytes and datagrams moved into the
//! receive ring, the slot's readiness flags, and the send-side reports that follow
//! the stack's progress (`slot::TX_CREDIT`, SO_ZEROCOPY's `slot::TX_ACKED`,
//! SO_TIMESTAMPING's error queue).

use std::net::SocketAddr;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

use usnet_session_abi::{
    errno, slot, RecordHeader, SockAddr, FLAG_ACCEPTABLE, FLAG_BOUND, FLAG_CONNECTED, FLAG_ERROR,
    FLAG_ERRQUEUE, FLAG_HUP, FLAG_RX_EOF, FLAG_SNDBUF, FLAG_WRITABLE, FLAG_WR_SHUT, RECORD_HEADER,
    RECORD_PAD, SEND_ASYNC, SEND_EOR, SEND_MORE, STAMP_TIMED, STAMP_TSONLY,
};
use usnet_shm::{ByteProducer, KeptLoan, TailLoan};
use usnet_stack::{
    Families, Lender, LentBytes, Owner, PendingAfter, RecvSink, SocketHandle, Stack, StackError,
};

use super::{
    err, options::apply_deferred, PendingDgram, Role, ServerSession, SessionSocket, SessionStats,
};

impl ServerSession {
    pub(super) fn activate(&mut self, i: u32) {
        if let Some(s) = self.socks[i as usize].as_mut() {
            if !s.tx_active {
                s.tx_active = true;
                self.active.push(i);
            }
        }
    }

    /// Moves bytes from the send rings of active sockets into the stack, at most
    /// `chunk` bytes per socket (the cluster size × clusters per request).
    pub fn drain_all(&mut self, stack: &mut Stack) {
        for i in std::mem::take(&mut self.rx_again) {
            self.refresh(stack, i);
        }
        self.publish_acked(stack);
        self.return_acked(stack);
        let mut k = 0;
        while k < self.ts_watched.len() {
            if self.stamp_progress(stack, self.ts_watched[k]) {
                k += 1;
            } else {
                self.ts_watched.swap_remove(k);
            }
        }
        let mut k = 0;
        while k < self.active.len() {
            let i = self.active[k];
            if self.drain_tx(stack, i) {
                k += 1;
            } else {
                self.active.swap_remove(k);
            }
        }
    }

    /// For each connection sending from its lent send ring: the bytes it is done
    /// with (acknowledged) go back to the client, with an event when the client's
    /// room grew. A connection that closed reads the ring no more: all of it goes
    /// back.
    fn return_acked(&mut self, stack: &mut Stack) {
        let mut k = 0;
        while k < self.lent_held.len() {
            let i = self.lent_held[k];
            let Some(s) = self.socks[i as usize].as_mut().filter(|s| s.lent) else {
                self.lent_held.swap_remove(k);
                continue;
            };
            let mut grew = match s.handle.and_then(|h| stack.tcp_lent_head(h)) {
                Some(head) => s.tx.release_to(head),
                None => {
                    s.lent = false;
                    s.tx.release()
                }
            };
            // The peer's window may close after the ring filled.
            if Self::unlend_if_bound(stack, s) {
                grew |= s.tx.release();
            }
            if s.tx.unreleased() == 0 || !s.lent {
                self.lent_held.swap_remove(k);
            } else {
                k += 1;
            }
            if grew {
                self.bump(i);
            }
        }
    }

    /// A full lent ring binds ([`Stack::tcp_lent_ring_binds`]): the connection
    /// takes what it holds of it into a buffer of its own, once, and the client
    /// writes on, so a lent ring never holds a program back where a copying
    /// connection would take its writes. Returns whether the ring went back.
    fn unlend_if_bound(stack: &mut Stack, s: &mut SessionSocket) -> bool {
        let Some(h) = s.handle.filter(|_| s.lent) else {
            return false;
        };
        if (s.tx.unreleased() as usize) < s.tx.size() || !stack.tcp_lent_ring_binds(h) {
            return false;
        }
        s.lent = false;
        stack.tcp_unlend_send_buffer(h);
        true
    }

    /// Connection `i` takes back what it holds of its lent send ring into a buffer
    /// of its own, and the ring goes back to the client whole: before the slot is
    /// reused, shared with another session, or written through `op::SEND`. It is
    /// not lent again.
    pub(super) fn unlend(&mut self, stack: &mut Stack, i: u32) {
        let Some(s) = self.socks[i as usize].as_mut() else {
            return;
        };
        s.lendable = false;
        if !s.lent {
            return;
        }
        s.lent = false;
        if let Some(h) = s.handle {
            stack.tcp_unlend_send_buffer(h);
        }
        if s.tx.release() {
            self.bump(i);
        }
    }

    /// For each SO_ZEROCOPY connection: how far the peer acknowledged the send
    /// ring's bytes (`slot::TX_ACKED`; `u64::MAX` once it can send no more), with an
    /// event when it moved.
    fn publish_acked(&mut self, stack: &mut Stack) {
        let mut k = 0;
        while k < self.zc_watched.len() {
            let i = self.zc_watched[k];
            let Some((h, consumed)) = self.socks[i as usize]
                .as_ref()
                .filter(|s| s.zc_watch)
                .and_then(|s| s.handle.map(|h| (h, s.tx.position())))
            else {
                self.zc_watched.swap_remove(k);
                continue;
            };
            k += 1;
            let s = self.socks[i as usize].as_mut().expect("watched");
            let acked = match stack.tcp_info(h) {
                Ok(info) if info.state != usnet_stack::TcpState::Closed => {
                    s.tx_gaps.acked(consumed, info.send_queued as u64)
                }
                _ => u64::MAX,
            };
            let w = self.mem.slot_u64(i, slot::TX_ACKED);
            if w.load(Relaxed) != acked {
                w.store(acked, Release);
                self.bump(i);
            }
        }
    }

    /// Moves what slot `i`'s send ring holds into the stack. Returns whether the socket
    /// stays active (more bytes, or the stack pushed back).
    pub(super) fn drain_tx(&mut self, stack: &mut Stack, i: u32) -> bool {
        let chunk = self.limits.chunk;
        let Some(s) = self.socks[i as usize].as_mut() else {
            return false;
        };
        if !s.tx_active {
            return false;
        }
        let mut avail = match s.tx.available() {
            Ok(n) => n,
            Err(_) => {
                self.stats.corrupt_rings += 1;
                0
            }
        };
        // Bytes past a hold wait for the request that set it (`slot::TX_HOLD`);
        // a closing socket's go regardless.
        let hold = self.mem.slot_u64(i, slot::TX_HOLD).load(Acquire);
        let mut held = false;
        if hold != 0 && !s.closing {
            let room = (hold - 1).saturating_sub(s.tx.position());
            let room = usize::try_from(room).unwrap_or(usize::MAX);
            held = avail > room;
            avail = avail.min(room);
        }
        let mut moved = 0usize;
        let mut pushed_back = false;
        // Ring bytes the client had lent went back all at once.
        let mut returned = false;
        match (s.role, s.handle) {
            (Role::Conn, Some(h)) if avail > 0 => {
                let want = avail.min(chunk);
                if s.lendable && !s.shared {
                    // The first bytes: the ring becomes the connection's send
                    // buffer, so they are sent from here (one copy fewer).
                    s.lendable = false;
                    let loan = s.tx.loan();
                    // The same ring as memory GSO frames carry bytes of.
                    let lender: Arc<dyn Lender> = Arc::new(KeptLoan::new(loan.clone()));
                    s.lent = stack
                        .tcp_lend_send_buffer(
                            h,
                            Box::new(RingLoan(loan)),
                            Some(lender),
                            s.tx.position(),
                            s.tx.size(),
                        )
                        .unwrap_or(false);
                }
                let r = if s.lent {
                    stack.tcp_send_lent(h, want)
                } else {
                    let tx = &mut s.tx;
                    stack.tcp_send_with(h, want, |dst| tx.read(dst))
                };
                match r {
                    Ok(n) => {
                        if s.lent {
                            s.tx.skip(n);
                        }
                        moved = n;
                        s.written += n as u64;
                        pushed_back = n < want;
                    }
                    Err(StackError::WouldBlock) => pushed_back = true,
                    Err(_) => {
                        // The connection failed or was shut down: the bytes can never
                        // go out; drop them as the kernel would. What it holds of a
                        // lent ring becomes its own, so the ring goes back whole.
                        if s.lent {
                            s.lent = false;
                            stack.tcp_unlend_send_buffer(h);
                        }
                        s.tx.skip(avail);
                    }
                }
                returned = Self::unlend_if_bound(stack, s);
                if s.lent {
                    if s.tx.unreleased() > 0 && !self.lent_held.contains(&i) {
                        self.lent_held.push(i);
                    }
                } else {
                    s.tx.release();
                }
            }
            (Role::Udp, _) if avail > 0 || s.pending_dgram.is_some() => {
                let owner = Owner(self.id);
                let mut bound = None;
                let (m, back) = Self::drain_udp(
                    stack,
                    s,
                    owner,
                    &mut bound,
                    &mut self.scratch,
                    chunk,
                    &mut self.stats,
                );
                moved = m;
                pushed_back = back;
                if let Some(h) = bound {
                    // sendto bound the socket: it is the client's like any other
                    // (owner clean-up, readiness, received datagrams), and the client
                    // learns its address now.
                    self.by_handle.insert(h, i);
                    self.refresh(stack, i);
                }
            }
            (_, _) if avail > 0 => {
                // Bytes on a socket that cannot send (not connected): discard them.
                s.tx.skip(avail);
                s.tx.release();
            }
            _ => {}
        }
        self.stats.bytes_in += moved as u64;
        if returned {
            self.bump(i);
        }
        let s = self.socks[i as usize].as_mut().expect("still here");
        if held && !pushed_back {
            // The rest waits for the request that set the hold, which activates
            // the socket again (a client that never sends it only holds itself).
            s.tx_active = false;
            if moved > 0 {
                self.bump(i);
            }
            return false;
        }
        let left = s.tx.ready();
        if pushed_back || left > 0 || s.pending_dgram.is_some() {
            if moved > 0 {
                self.bump(i);
            }
            return true;
        }
        // Drained. A close or SHUT_WR that waited for it happens now.
        let (closing, shut_wr) = (s.closing, s.shut_wr);
        if closing {
            self.finish_close(stack, i);
            return false;
        }
        if shut_wr {
            if let Some(h) = s.handle.filter(|_| s.role == Role::Conn) {
                s.shut_wr = false;
                let _ = stack.tcp_shutdown_write(h);
                self.set_flags(i, FLAG_WR_SHUT, 0);
            }
        }
        // Arm the kick, then look once more (Dekker with the client's publish:
        // usnet_shm::arm).
        let s = self.socks[i as usize].as_mut().expect("still here");
        let armed = self.mem.slot_word(i, slot::TX_ARMED);
        if usnet_shm::arm::arm(armed, || s.tx.available().unwrap_or(0) > 0) {
            return true;
        }
        s.tx_active = false;
        if moved > 0 {
            self.bump(i);
        }
        false
    }

    /// Before a request on datagram socket `i` is carried out, the datagrams the
    /// program sent before it go to the stack, under the options they were
    /// written under: a kernel's `sendto` is done when it returns, so an
    /// `IP_TTL` set between two sends (traceroute -I's probes on one raw
    /// socket), a connect or a bind never reaches back to an earlier datagram.
    /// Stops early only where the stack pushes back (its send queue is full).
    pub(super) fn flush_dgrams(&mut self, stack: &mut Stack, i: u32) {
        loop {
            let Some(s) = self.socks[i as usize].as_mut() else {
                return;
            };
            if s.role != Role::Udp || !(s.tx_active || s.tx.available().unwrap_or(0) > 0) {
                return;
            }
            let before = s.tx.position();
            self.activate(i);
            if !self.drain_tx(stack, i) {
                self.active.retain(|&x| x != i);
                return;
            }
            let s = self.socks[i as usize].as_ref().expect("still here");
            if s.pending_dgram.is_some() || s.tx.position() == before {
                return;
            }
        }
    }

    /// `op::SEND`: the write that lies in slot `i`'s send ring from `start` to `end`,
    /// taken by the stack as Linux's `tcp_sendmsg` takes one (chunk by chunk within
    /// the send buffer's limit, `MSG_MORE`, `MSG_EOR`). Bytes before `start` go in
    /// first, as [`Self::drain_tx`] moves them; what the stack refuses of the write
    /// is dropped from the ring (the client tells the program it was not taken).
    /// Returns the bytes of the write the stack took.
    pub(super) fn op_send(
        &mut self,
        stack: &mut Stack,
        i: u32,
        start: u64,
        end: u64,
        flags: u64,
    ) -> i64 {
        let chunk = self.limits.chunk;
        // Such writes are admitted step by step from the ring and may drop what the
        // stack refuses: the connection keeps its own buffer from here on.
        self.unlend(stack, i);
        let Some(s) = self.socks[i as usize].as_mut() else {
            return -errno::EBADF;
        };
        let (Role::Conn, Some(h)) = (s.role, s.handle) else {
            return -errno::EPIPE;
        };
        let Ok(avail) = s.tx.available() else {
            self.stats.corrupt_rings += 1;
            return -errno::EINVAL;
        };
        s.send_used = true;
        let pos = s.tx.position();
        if start > end || end > pos + avail as u64 || end - start > s.tx.size() as u64 {
            self.stats.bad_requests += 1;
            return -errno::EINVAL;
        }
        // Bytes written before this write, in the usual way (a drain may also have
        // taken some of this write's already: the stack took them).
        let mut at = pos;
        while at < start {
            let want = ((start - at) as usize).min(chunk);
            let tx = &mut s.tx;
            match stack.tcp_send_with(h, want, |dst| tx.read(dst)) {
                Ok(n) if n > 0 => at += n as u64,
                _ => break,
            }
        }
        s.written += at - pos;
        let before = at.saturating_sub(start).min(end - start);
        let mut leftover = false;
        let mut took = before;
        let mut moved = at - pos;
        // What is left of the write; nothing when the stack already took all of it
        // (`at` may lie past `end`: the client names the range, the drain moved on).
        let left = end.saturating_sub(at.max(start));
        if at >= start && left > 0 {
            let n = left as usize;
            let got = s.tx.ready().min(n);
            let more = flags & SEND_MORE != 0;
            // Straight from the shared ring into the socket, as the drain moves bytes
            // (no copy of the write beside the ring first).
            let tx = &s.tx;
            let mut at = 0;
            let r = stack.tcp_send_more_with(h, got, more, |dst| {
                let k = tx.peek(at, dst);
                at += k;
                k
            });
            let k = match r {
                Ok(k) => k,
                Err(StackError::WouldBlock) => 0,
                Err(_) if flags & SEND_ASYNC != 0 => 0,
                Err(e) => {
                    s.tx.skip(got);
                    s.tx.release();
                    return err(e);
                }
            };
            if flags & SEND_EOR != 0 && k == got && k > 0 {
                let _ = stack.tcp_end_record(h);
            }
            if flags & SEND_ASYNC != 0 {
                // The client counted every byte as taken: what the stack did not
                // take (it should not happen within the credit) goes out later by
                // the usual drain, never dropped.
                s.tx.skip(k);
                if k < got {
                    leftover = true;
                }
            } else {
                s.tx.skip(got);
                if k < got && s.zc_watch {
                    s.tx_gaps
                        .push(s.tx.position() - (got - k) as u64, (got - k) as u64);
                }
            }
            took += k as u64;
            moved += k as u64;
            s.written += k as u64;
        } else if left > 0 && flags & SEND_ASYNC != 0 {
            leftover = true;
        } else if left > 0 {
            // Older bytes still wait: the write gets nothing now, and is dropped.
            let n = left as usize;
            s.tx.skip(n);
            if s.zc_watch {
                s.tx_gaps.push(s.tx.position() - n as u64, n as u64);
            }
        }
        s.tx.release();
        if took > 0 {
            // Linux's `tcp_tx_timestamp`: the write's last byte is marked.
            if let Some(st) = s.stamps.as_mut() {
                st.record(s.written);
            }
        }
        self.stats.bytes_in += moved;
        if moved > 0 {
            self.bump(i);
        }
        if leftover {
            self.activate(i);
        }
        // The marked byte may have left already.
        self.stamp_progress(stack, i);
        self.send_flags(stack, i);
        took as i64
    }

    /// Feeds connection `i`'s transmit timestamps what its stack socket sent and
    /// had acknowledged; `FLAG_ERRQUEUE` while reports wait. Returns whether it
    /// still has something to watch.
    fn stamp_progress(&mut self, stack: &Stack, i: u32) -> bool {
        let now = stack.now().as_nanos();
        let Some(s) = self.socks[i as usize].as_mut() else {
            return false;
        };
        let written = s.written;
        let Some(st) = s.stamps.as_mut() else {
            return false;
        };
        if st.marked() {
            let progress = match (s.role, s.handle) {
                (Role::Conn, Some(h)) => stack
                    .tcp_info(h)
                    .ok()
                    .filter(|i| i.state != usnet_stack::TcpState::Closed),
                _ => None,
            };
            let (sent, acked) = match progress {
                Some(info) => {
                    let acked = written.saturating_sub(info.send_queued as u64);
                    let sent = (acked + u64::from(info.bytes_in_flight)).min(written);
                    (sent, Some(acked))
                }
                None => (0, None),
            };
            st.progress(sent, acked, now);
        }
        let (queued, watch) = (st.queued(), st.wants_tx() || st.queued());
        if queued != (s.flags & FLAG_ERRQUEUE != 0) {
            let (set, clear) = if queued {
                (FLAG_ERRQUEUE, 0)
            } else {
                (0, FLAG_ERRQUEUE)
            };
            self.set_flags(i, set, clear);
        }
        watch
    }

    /// `slot::TX_CREDIT` of connection `i` (whose writes meet the stack when
    /// `bounded`): the ring position up to which a write would surely be taken
    /// whole, so the client posts it without waiting.
    fn publish_credit(&mut self, stack: &Stack, i: u32, bounded: bool) {
        let s = self.sock(i);
        let credit = match s.handle {
            Some(h) if bounded => {
                s.tx.position() + u64::from(stack.tcp_sure_write_room(h).unwrap_or(0))
            }
            _ => 0,
        };
        let w = self.mem.slot_u64(i, slot::TX_CREDIT);
        if w.load(Relaxed) != credit {
            w.store(credit, Release);
        }
    }

    /// `op::ERRQUEUE`: the oldest transmit timestamp of connection `i`; on a
    /// datagram socket its oldest ICMP error report, into the slot's area.
    pub(super) fn op_errqueue(&mut self, stack: &mut Stack, i: u32) -> Option<(i64, [u64; 2])> {
        if let (Role::Udp, Some(h)) = (self.sock(i).role, self.sock(i).handle) {
            return Some((self.dgram_errqueue(stack, i, h), [0, 0]));
        }
        let now = stack.now().as_nanos();
        let stamp = self.sock(i).stamps.as_mut().and_then(|st| st.take());
        self.stamp_progress(stack, i);
        let Some(st) = stamp else {
            return Some((-errno::EAGAIN, [0, 0]));
        };
        let mut aux0 = u64::from(st.key);
        if st.tsonly {
            aux0 |= STAMP_TSONLY;
        }
        let age = match st.at {
            Some(at) => {
                aux0 |= STAMP_TIMED;
                now.saturating_sub(at)
            }
            None => 0,
        };
        Some((i64::from(st.info), [aux0, age]))
    }

    fn dgram_errqueue(&mut self, stack: &mut Stack, i: u32, h: SocketHandle) -> i64 {
        let error = self.mem.slot_word(i, slot::ERROR);
        // An error the stack holds for the socket is the word's first.
        if let Ok(Some(e)) = stack.udp_take_error(h) {
            error.store(e as u32, Release);
        }
        let Ok(Some((r, after))) = stack.udp_errqueue_pop(h) else {
            return -errno::EAGAIN;
        };
        let report = usnet_session_abi::ErrReport {
            errno: r.errno as u32,
            origin: r.origin,
            icmp_type: r.icmp_type,
            code: r.code,
            hop_limit: r.hop_limit,
            info: r.info,
            tos: r.tos,
            len: r.payload.len().min(usnet_session_abi::ErrReport::ROOM) as u16,
            whole: r.payload.len() as u32,
            offender: r
                .offender
                .map(|ip| SockAddr::from_std(std::net::SocketAddr::new(ip, 0)))
                .unwrap_or_default(),
            dest: SockAddr::from_std(r.dest),
        };
        self.mem.write_err_report(i, &report, &r.payload);
        // Linux's `sock_dequeue_err_skb`: the next report's errno, or none.
        match after {
            PendingAfter::Set(e) => error.store(e as u32, Release),
            PendingAfter::Cleared => error.store(0, Release),
            PendingAfter::Unchanged => {}
        }
        let _ = stack.udp_take_error(h);
        self.dgram_errqueue_flag(stack, i, h);
        self.bump(i);
        0
    }

    /// `FLAG_ERRQUEUE` of datagram socket `i`: whether reports wait.
    fn dgram_errqueue_flag(&mut self, stack: &Stack, i: u32, h: SocketHandle) {
        if stack.udp_errqueue_len(h).unwrap_or(0) > 0 {
            self.set_flags(i, FLAG_ERRQUEUE, 0);
        } else {
            self.set_flags(i, 0, FLAG_ERRQUEUE);
        }
    }

    /// `op::LOCAL_ERROR`: a local report on datagram socket `i`'s error queue.
    pub(super) fn op_local_error(&mut self, stack: &mut Stack, i: u32, args: &[u64; 6]) -> i64 {
        let s = self.sock(i);
        let (Role::Udp, Some(h)) = (s.role, s.handle) else {
            return -errno::EINVAL;
        };
        let Some(dest) = SockAddr::from_args(args).to_std() else {
            return -errno::EINVAL;
        };
        let errno = i32::try_from(args[4]).unwrap_or(errno::EMSGSIZE as i32);
        let mtu = u32::try_from(args[5]).unwrap_or(u32::MAX);
        match stack.udp_local_error(h, errno, dest, mtu) {
            Ok(()) => {
                self.dgram_errqueue_flag(stack, i, h);
                0
            }
            Err(e) => err(e),
        }
    }

    /// Keeps `FLAG_SNDBUF` and `FLAG_WRITABLE` of connection `i` current: whether
    /// its send-buffer limit was chosen, and then whether the stack would take a
    /// write (a change bumps the event counter: an edge-triggered `EPOLLOUT`).
    pub(super) fn send_flags(&mut self, stack: &mut Stack, i: u32) {
        let s = self.sock(i);
        let Some(h) = s.handle.filter(|_| s.role == Role::Conn) else {
            return;
        };
        let (set, clear) = send_bits(stack, s, h);
        self.publish_credit(stack, i, set & FLAG_SNDBUF != 0);
        self.set_flags(i, set, clear);
    }

    /// UDP records from the send ring into the stack. Returns (bytes, pushed back).
    #[allow(clippy::too_many_arguments)]
    fn drain_udp(
        stack: &mut Stack,
        s: &mut SessionSocket,
        owner: Owner,
        bound: &mut Option<SocketHandle>,
        scratch: &mut Vec<u8>,
        chunk: usize,
        stats: &mut SessionStats,
    ) -> (usize, bool) {
        let mut moved = 0;
        loop {
            if let Some(d) = s.pending_dgram.take() {
                let Some(h) = s.handle else {
                    return (moved, false);
                };
                match stack.udp_send_msg(h, &d.data, d.to, &d.meta) {
                    Err(StackError::WouldBlock) => {
                        s.pending_dgram = Some(d);
                        return (moved, true);
                    }
                    // Other errors lose the datagram, as a kernel send would report
                    // them to the caller; the counters tell.
                    _ => moved += d.data.len(),
                }
            }
            if moved >= chunk {
                return (moved, true);
            }
            let avail = s.tx.ready();
            // Records never wrap: fewer bytes than a header before the ring's end are
            // skipped without a marker.
            let size = ring_size(s);
            let to_end = size - (s.tx.position() as usize & (size - 1));
            if to_end < RECORD_HEADER && avail >= to_end {
                s.tx.skip(to_end);
                s.tx.release();
                continue;
            }
            if avail < RECORD_HEADER {
                if avail > 0 {
                    // A partial header means a broken producer: resynchronise.
                    stats.corrupt_rings += 1;
                    s.tx.skip(avail);
                    s.tx.release();
                }
                return (moved, false);
            }
            let mut h = [0u8; RECORD_HEADER];
            s.tx.peek(0, &mut h);
            let hdr = RecordHeader::from_bytes(&h);
            let len = hdr.len;
            if len == RECORD_PAD {
                // Skip to the start of the ring.
                s.tx.skip(to_end.min(avail));
                s.tx.release();
                continue;
            }
            let rec = usnet_session_abi::record_len(len as usize);
            if len as usize > usnet_stack::MAX_UDP_PAYLOAD || rec > avail {
                stats.corrupt_rings += 1;
                s.tx.skip(avail);
                s.tx.release();
                return (moved, false);
            }
            scratch.resize(len as usize, 0);
            s.tx.peek(RECORD_HEADER, scratch);
            s.tx.skip(rec);
            s.tx.release();
            let to = if hdr.peer.family == 0 {
                None
            } else {
                hdr.peer.to_std()
            };
            s.pending_dgram = Some(PendingDgram {
                data: std::mem::take(scratch),
                to,
                meta: usnet_stack::UdpSendMeta {
                    src: hdr.local,
                    hop_limit: hdr.hop_limit,
                    tos: hdr.tos,
                },
            });
            if s.handle.is_none() {
                // sendto on an unbound UDP socket binds it to an ephemeral port.
                let v6 = to.is_some_and(|a| a.is_ipv6());
                let any: SocketAddr = if v6 { "[::]:0" } else { "0.0.0.0:0" }
                    .parse()
                    .expect("addr");
                match stack.dgram_bind(s.dgram_proto(), any, Families::Both, false) {
                    Ok(h) => {
                        let _ = stack.set_owner(h, owner);
                        s.handle = Some(h);
                        apply_deferred(stack, s, h);
                        *bound = Some(h);
                    }
                    Err(_) => {
                        s.pending_dgram = None;
                        return (moved, false);
                    }
                }
            }
        }
    }

    /// A stack socket's readiness changed (or the client made room): bring the
    /// client's view up to date.
    pub fn on_ready(&mut self, stack: &mut Stack, h: SocketHandle) {
        if let Some(&i) = self.by_handle.get(&h) {
            // A new UDP binding made by sendto: tell the client its address.
            self.refresh(stack, i);
            if self.socks[i as usize].as_ref().is_some_and(|s| s.tx_active) {
                // Writable again: the stack took what it refused before.
                self.drain_tx(stack, i);
            }
        }
    }

    /// Connection `i` writes what it receives straight into the receive ring while
    /// it may: this slot alone receives its stream (not shared, nothing carried
    /// over from another receiver) and the client has not closed it. Otherwise the
    /// sink goes, and what it wrote is the ring's like anything pushed.
    fn direct_rx(&mut self, stack: &mut Stack, i: u32) {
        let Some(s) = self.socks[i as usize].as_mut() else {
            return;
        };
        let Some(h) = s.handle else {
            return;
        };
        let may =
            s.role == Role::Conn && s.receiver && !s.shared && !s.closing && s.carry.is_empty();
        if may && !s.rx_direct {
            let sink = RingSink(s.rx.lend_tail());
            if stack.tcp_set_recv_sink(h, Some(Box::new(sink))).is_ok() {
                s.rx_direct = true;
            } else {
                s.rx.end_tail_loans();
            }
        } else if !may && s.rx_direct {
            self.end_direct_rx(stack, i);
        }
    }

    /// Connection `i` no longer writes into the receive ring (see `direct_rx`).
    pub(super) fn end_direct_rx(&mut self, stack: &mut Stack, i: u32) {
        let Some(s) = self.socks[i as usize].as_mut().filter(|s| s.rx_direct) else {
            return;
        };
        s.rx_direct = false;
        if let Some(h) = s.handle {
            let _ = stack.tcp_set_recv_sink(h, None);
        }
        s.rx.end_tail_loans();
    }

    /// Moves received data into slot `i`'s receive ring and updates its flags.
    pub(super) fn refresh(&mut self, stack: &mut Stack, i: u32) {
        self.direct_rx(stack, i);
        let chunk = self.limits.chunk;
        let Some(s) = self.socks[i as usize].as_mut() else {
            return;
        };
        let Some(h) = s.handle else {
            return;
        };
        let mut moved = 0usize;
        let mut set = 0u32;
        let mut clear = 0u32;
        let mut error = None;
        let mut again = false;
        match s.role {
            Role::Conn => {
                // What the connection wrote into the ring itself since the last
                // look (`direct_rx`) is published with the rest.
                moved += s.rx.unpublished();
                // After SHUT_RD what arrives is still queued for reading, as on
                // Linux (reads of an empty ring then see the end).
                if !s.rx_blocked && s.receiver {
                    // Pull into the ring until the stack has nothing more, the stream
                    // ended, or the ring is full and stays full after arming the kick.
                    // The room found after arming is filled at once: the client's read
                    // that made it saw the kick unarmed and will not ask, and the last
                    // bytes of a stream bring no further readiness from the stack.
                    loop {
                        let free = match s.rx.free() {
                            Ok(f) => f,
                            Err(_) => {
                                self.stats.corrupt_rings += 1;
                                break;
                            }
                        };
                        let mut room = free.min(chunk.saturating_sub(moved));
                        let mut drained = false;
                        if !s.carry.is_empty() {
                            // What the previous receiver left unread comes first.
                            let k = room.min(s.carry.len());
                            let n = s.rx.push(&s.carry[..k]);
                            s.carry.drain(..n);
                            moved += n;
                            room -= n;
                        }
                        while room > 0 && s.carry.is_empty() {
                            let rx = &mut s.rx;
                            match stack.tcp_recv_with_to_mark(h, room, |c| {
                                rx.push(c);
                            }) {
                                // At the urgent mark: the client learns where it is
                                // (before anything after it is published) and gets
                                // the byte for MSG_OOB; the stream goes on.
                                Ok(0) if stack.tcp_at_urgent_mark(h) => {
                                    if let Ok(Some(b)) = stack.tcp_take_urgent_at_mark(h) {
                                        let mark = s.rx.position() + 1;
                                        self.mem
                                            .slot_u64(i, slot::RX_URG_MARK)
                                            .store(mark, Release);
                                        self.mem
                                            .slot_word(i, slot::RX_OOB)
                                            .store(0x100 | u32::from(b), Release);
                                    }
                                }
                                // The call that finds nothing also tells end-of-stream.
                                Ok(0) => {
                                    if !s.eof {
                                        s.eof = true;
                                        set |= FLAG_RX_EOF;
                                    }
                                    drained = true;
                                    break;
                                }
                                Ok(n) => {
                                    moved += n;
                                    room -= n;
                                }
                                Err(StackError::WouldBlock) => {
                                    drained = true;
                                    break;
                                }
                                Err(e) => {
                                    error = Some(e);
                                    drained = true;
                                    break;
                                }
                            }
                        }
                        s.rx.publish();
                        if drained || s.eof {
                            break;
                        }
                        if s.rx.free().unwrap_or(0) > 0 {
                            // The per-turn budget ran out with room left: the rest
                            // comes next turn (`drain_all`).
                            again = true;
                            break;
                        }
                        // Full ring with more to tell: arm the kick, then look once more;
                        // room that appeared meanwhile is filled at once.
                        let armed = self.mem.slot_word(i, slot::RX_ARMED);
                        if !usnet_shm::arm::arm(armed, || s.rx.free().unwrap_or(0) > 0) {
                            s.rx_blocked = true;
                            break;
                        }
                    }
                }
                // The connection's own bytes go out even when the loop did not run.
                s.rx.publish();
                if let Ok(r) = stack.readiness(h) {
                    if r.connected {
                        set |= FLAG_CONNECTED;
                    }
                    if r.closed {
                        set |= FLAG_HUP;
                    }
                }
                if let Ok(Some(e)) = stack.tcp_error(h) {
                    error = Some(e);
                }
                let (s_set, s_clear) = send_bits(stack, s, h);
                set |= s_set;
                clear |= s_clear;
                let credit = if s_set & FLAG_SNDBUF != 0 {
                    s.tx.position() + u64::from(stack.tcp_sure_write_room(h).unwrap_or(0))
                } else {
                    0
                };
                self.mem.slot_u64(i, slot::TX_CREDIT).store(credit, Release);
            }
            Role::Listener => {
                let r = stack.readiness(h).unwrap_or_default();
                if r.readable {
                    set |= FLAG_ACCEPTABLE;
                } else {
                    clear |= FLAG_ACCEPTABLE;
                }
            }
            Role::Udp => {
                if !s.rx_blocked && s.receiver && !s.carry.is_empty() {
                    // Datagrams another holder left unread come first; what the
                    // stack queued since waits until they are all in.
                    push_udp_carry(s);
                    s.rx.publish();
                    if s.carry.len() >= RECORD_HEADER {
                        // The next does not fit: wait for the client's kick, as
                        // below for the stack's queue.
                        let len = u32::from_le_bytes(s.carry[0..4].try_into().expect("4 bytes"));
                        let armed = self.mem.slot_word(i, slot::RX_ARMED);
                        if usnet_shm::arm::arm(armed, || udp_record_fits(&mut s.rx, len as usize)) {
                            again = true;
                        } else {
                            s.rx_blocked = true;
                        }
                    }
                }
                if !s.rx_blocked && s.receiver && s.carry.is_empty() {
                    loop {
                        moved += Self::fill_udp(stack, s, h, chunk - moved.min(chunk));
                        s.rx.publish();
                        let Ok(Some(len)) = stack.udp_peek_len(h) else {
                            break;
                        };
                        if moved >= chunk {
                            // The per-turn budget ran out: the rest comes next turn.
                            again = true;
                            break;
                        }
                        // The next datagram does not fit: arm the kick, then look once
                        // more (the client may have made room meanwhile). Without the
                        // kick a queue that never empties would never be moved again.
                        let armed = self.mem.slot_word(i, slot::RX_ARMED);
                        if !usnet_shm::arm::arm(armed, || udp_record_fits(&mut s.rx, len)) {
                            s.rx_blocked = true;
                            break;
                        }
                    }
                }
                s.rx.publish();
                // ICMP errors: the pending one is the ERROR word alone (a
                // datagram socket stays usable); reports raise FLAG_ERRQUEUE.
                if let Ok(Some(e)) = stack.udp_take_error(h) {
                    self.mem.slot_word(i, slot::ERROR).store(e as u32, Release);
                    self.bump(i);
                }
                self.dgram_errqueue_flag(stack, i, h);
                let s = self.sock(i);
                if s.flags & FLAG_BOUND == 0 {
                    if let Ok(l) = stack.udp_local_addr(h) {
                        self.mem
                            .set_slot_addr(i, slot::LOCAL, &SockAddr::from_std(l));
                        set |= FLAG_BOUND;
                    }
                }
            }
            Role::Fresh => {}
        }
        if let Some(e) = error {
            let old = self.mem.slot_word(i, slot::ERROR).load(Relaxed);
            if old == 0 && self.sock(i).flags & FLAG_ERROR == 0 {
                self.mem
                    .slot_word(i, slot::ERROR)
                    .store(e.errno() as u32, Release);
            }
            set |= FLAG_ERROR | FLAG_HUP;
        }
        self.stats.bytes_out += moved as u64;
        if moved > 0 {
            self.bump(i);
        }
        if again && !self.rx_again.contains(&i) {
            self.rx_again.push(i);
        }
        self.set_flags(i, set, clear);
    }

    /// Datagrams from the stack's queue into the receive ring as records, while they
    /// fit. Returns the payload bytes moved.
    fn fill_udp(stack: &mut Stack, s: &mut SessionSocket, h: SocketHandle, chunk: usize) -> usize {
        let mut moved = 0;
        // The receive timestamp of what this call queues (read once: the
        // datagrams came in the same turn).
        let mut stamp_ns = None;
        while moved < chunk {
            let Ok(Some(len)) = stack.udp_peek_len(h) else {
                break;
            };
            if !udp_record_fits(&mut s.rx, len) {
                break;
            }
            let rec = usnet_session_abi::record_len(len);
            skip_tail_if_short(&mut s.rx, rec);
            // The sender is known only once the datagram is taken: the header is
            // completed after the payload, before the record is published.
            let start_pos = s.rx.position();
            s.rx.push(&[0u8; RECORD_HEADER]);
            let rx = &mut s.rx;
            let Ok((n, info)) = stack.udp_recv_with(h, |c| {
                rx.push(c);
            }) else {
                break;
            };
            let pad = rec - RECORD_HEADER - n;
            if pad > 0 {
                s.rx.push(&[0u8; 8][..pad]);
            }
            let hdr = RecordHeader {
                len: n as u32,
                peer: SockAddr::from_std(info.from),
                local: Some(info.dst),
                hop_limit: Some(info.hop_limit),
                tos: Some(info.tos),
                ifindex: usnet_session::ctl::msg::Iface::index_for(stack.config().ifindex),
                spec_dst: match stack.udp_reply_source(&info) {
                    Some(std::net::IpAddr::V4(a)) => a,
                    _ => std::net::Ipv4Addr::UNSPECIFIED,
                },
                stamp_ns: *stamp_ns.get_or_insert_with(|| {
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64)
                }),
            };
            s.rx.rewrite(start_pos, &hdr.to_bytes());
            moved += n;
        }
        moved
    }
}

/// `FLAG_SNDBUF` and `FLAG_WRITABLE` of connection `s` as (set, clear): whether its
/// send-buffer limit was chosen, and whether the stack would take a write now
/// (kept only while someone may wait for it).
fn send_bits(stack: &mut Stack, s: &SessionSocket, h: SocketHandle) -> (u32, u32) {
    // Transmit timestamps mark the last byte of each write: the stack must see
    // the writes.
    let stamped = s.stamps.as_ref().is_some_and(|st| st.wants_tx());
    let bounded = s.sndbuf_set || stamped || stack.tcp_send_limit_chosen(h).unwrap_or(false);
    let mut set = if bounded { FLAG_SNDBUF } else { 0 };
    // The client waits on this flag: a "no" arms the stack's wake for the ACK that
    // makes room (`tcp_poll_writable`), or a write pushed for the client later (its
    // queued bytes) could fill the socket with nothing left to report it emptied.
    if (bounded || s.send_used) && stack.tcp_poll_writable(h) {
        set |= FLAG_WRITABLE;
    }
    (set, (FLAG_SNDBUF | FLAG_WRITABLE) & !set)
}

/// The bytes of a send ring that `op::SEND` dropped (the stack refused them), kept
/// while SO_ZEROCOPY maps the stack's acknowledged bytes back to ring positions.
#[derive(Debug, Default)]
pub(super) struct TxGaps {
    /// (ring position, length), in order, not yet passed by the acknowledgements.
    list: std::collections::VecDeque<(u64, u64)>,
    /// The length of the gaps already passed.
    passed: u64,
}

impl TxGaps {
    fn push(&mut self, pos: u64, len: u64) {
        self.list.push_back((pos, len));
    }

    /// The ring position up to which the peer acknowledged everything, from the
    /// ring's consumed position and the bytes the stack still holds. A gap right
    /// at the acknowledged point counts as acknowledged: nothing of it waits.
    fn acked(&mut self, consumed: u64, queued: u64) -> u64 {
        let dropped = self.passed + self.list.iter().map(|g| g.1).sum::<u64>();
        // Bytes the stack took and the peer acknowledged, then as ring positions.
        let mut at = consumed.saturating_sub(dropped).saturating_sub(queued) + self.passed;
        while let Some(&(pos, len)) = self.list.front() {
            if pos > at {
                break;
            }
            at += len;
            self.passed += len;
            self.list.pop_front();
        }
        at
    }
}

/// A client's send ring, read in place by the connection it feeds.
#[derive(Debug)]
struct RingLoan(usnet_shm::ByteLoan);

impl LentBytes for RingLoan {
    fn slices(&self, pos: u64, n: usize) -> (&[u8], &[u8]) {
        self.0.slices(pos, n)
    }
}

/// A client's receive ring as its connection's receive sink (`direct_rx`).
#[derive(Debug)]
struct RingSink(TailLoan);

impl RecvSink for RingSink {
    fn room(&self) -> usize {
        self.0.free()
    }
    fn push(&mut self, chunk: &[u8]) {
        self.0.push(chunk);
    }
}

fn ring_size(s: &SessionSocket) -> usize {
    s.tx.size()
}

/// Records never wrap: if a record of `rec` bytes does not fit before the ring's
/// end, the tail is marked skipped (a pad header when one fits; a shorter tail is
/// skipped by rule) and the record starts over at 0.
fn skip_tail_if_short(rx: &mut ByteProducer, rec: usize) {
    let size = rx.size();
    let to_end = size - (rx.position() as usize & (size - 1));
    if rec > to_end {
        let mut tail = vec![0u8; to_end];
        if to_end >= RECORD_HEADER {
            tail[0..4].copy_from_slice(&RECORD_PAD.to_le_bytes());
        }
        rx.push(&tail);
    }
}

/// Whole records from `s.carry` (laid end to end, as `sharing::udp_records` leaves
/// them) into the receive ring, while they fit.
fn push_udp_carry(s: &mut SessionSocket) {
    while s.carry.len() >= RECORD_HEADER {
        let len = u32::from_le_bytes(s.carry[0..4].try_into().expect("4 bytes")) as usize;
        let rec = usnet_session_abi::record_len(len);
        if len > usize::from(u16::MAX) || rec > s.carry.len() {
            // Not what udp_records lays out: drop it rather than publish garbage.
            s.carry.clear();
            break;
        }
        if !udp_record_fits(&mut s.rx, len) {
            break;
        }
        skip_tail_if_short(&mut s.rx, rec);
        s.rx.push(&s.carry[..rec]);
        s.carry.drain(..rec);
    }
    if s.carry.len() < RECORD_HEADER {
        // Nothing or no whole record: nothing to wait for.
        s.carry.clear();
    }
}

/// Whether a datagram of `len` bytes fits in the receive ring as one record (with
/// the skip to the ring's start that a record too long for the tail needs).
fn udp_record_fits(rx: &mut ByteProducer, len: usize) -> bool {
    let rec = usnet_session_abi::record_len(len);
    let Ok(free) = rx.free() else {
        return false;
    };
    let size = rx.size();
    let to_end = size - (rx.position() as usize & (size - 1));
    let need = if rec > to_end { to_end + rec } else { rec };
    need <= free
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::*;

    use std::time::Duration;

    use usnet_session_abi::{
        op, slot, Request, SockAddr, FLAG_RX_EOF, KIND_TCP, KIND_UDP, RECORD_HEADER,
    };

    use super::TxGaps;
    use crate::fuzzing::{Harness, ADDR};

    /// Writes what fits of `data` into slot `i`'s send ring, kicking the server if it
    /// asked. Returns how many bytes went in.
    fn write(h: &Harness, i: u32, data: &[u8]) -> usize {
        let at = h.mem().tx_ring(i);
        let prod = || h.mem().region().u64(at.prod).load(Acquire);
        let before = prod();
        h.send_bytes(i, data);
        if h.mem().slot_word(i, slot::TX_ARMED).swap(0, AcqRel) == 1 {
            h.submit(&Request {
                op: op::TX_KICK,
                slot: i,
                ..Default::default()
            });
        }
        (prod() - before) as usize
    }

    /// Sends `data` from slot `from` and reads it at slot `to`, a ring at a time.
    fn pump(h: &mut Harness, from: u32, to: u32, data: &[u8]) -> Vec<u8> {
        let (mut sent, mut got) = (0, Vec::new());
        for _ in 0..500 {
            if got.len() == data.len() {
                break;
            }
            sent += write(h, from, &data[sent..]);
            h.turn();
            got.extend(h.recv(to));
        }
        got
    }

    /// Stream bytes written into a send ring reach the stack socket, cross to the
    /// peer's socket and come out of its receive ring, in order, both ways, many
    /// rings' worth (4 KiB rings).
    #[test]
    fn stream_bytes_cross_the_stack_in_order_both_ways() {
        let mut h = Harness::new();
        h.connected_pair(7120);
        let data: Vec<u8> = (0..50_000u32).map(|k| (k * 7 % 251) as u8).collect();
        assert!(pump(&mut h, 1, 2, &data) == data, "1 → 2");
        let back: Vec<u8> = data.iter().rev().copied().take(20_000).collect();
        assert!(pump(&mut h, 2, 1, &back) == back, "2 → 1");
        let stats = h.parts(1).0.stats;
        assert_eq!(stats.bytes_in, 70_000);
        assert_eq!(stats.bytes_out, 70_000);
        h.finish();
    }

    /// What a connection receives in order goes straight into the client's ring
    /// while nothing is queued; with the reader away the ring fills, the rest waits
    /// in the connection's queue, and once read the stream is whole and in order,
    /// and the straight path takes over again.
    #[test]
    fn received_bytes_go_straight_into_the_ring_and_queue_behind_a_full_one() {
        let mut h = Harness::new();
        h.connected_pair(7121);
        let direct = |h: &Harness| h.stack().counters_snapshot().tcp_rx_direct_bytes;
        let data: Vec<u8> = (0..40_000u32).map(|k| (k * 13 % 251) as u8).collect();
        // A ring's worth first, read as it comes: all of it goes straight.
        assert!(pump(&mut h, 1, 2, &data[..4096]) == data[..4096]);
        let first = direct(&h);
        assert!(first >= 4000, "straight into the ring: {first}");
        // The reader away: the 4 KiB ring fills and the rest is queued.
        let mut sent = 4096;
        for _ in 0..50 {
            sent += write(&h, 1, &data[sent..20_000]);
            h.turn();
        }
        assert_eq!(sent, 20_000);
        let queued = direct(&h) - first;
        assert!(
            queued < 16_000,
            "a full ring takes nothing straight: {queued}"
        );
        let mut got = data[..4096].to_vec();
        for _ in 0..100 {
            got.extend(h.recv(2));
            h.turn();
        }
        assert!(got == data[..20_000], "in order across the queue");
        // The queue is empty again: the straight path is back.
        let before = direct(&h);
        let rest = pump(&mut h, 1, 2, &data[20_000..]);
        assert!(rest == data[20_000..]);
        assert!(direct(&h) > before, "straight again");
        h.finish();
    }

    /// UDP records written into a send ring arrive as records in the receiving
    /// socket's ring: in order, each with its length and sender.
    #[test]
    fn datagrams_arrive_as_records_in_order_with_their_sender() {
        let mut h = Harness::new();
        let udp = [KIND_UDP, 0, 0, 0, 0, 0];
        assert_eq!(h.call(op::SOCKET, 0, udp), 0);
        assert_eq!(h.call(op::SOCKET, 0, udp), 1);
        for (i, port) in [(0, 7121), (1, 7122)] {
            let a = SockAddr::from_std((ADDR, port).into()).to_args();
            assert_eq!(h.call(op::BIND, i, [a[0], a[1], a[2], a[3], 0, 0]), 0);
        }
        let to = SockAddr::from_std((ADDR, 7121).into());
        for (len, fill) in [(10, 1u8), (300, 2)] {
            let mut rec = vec![fill; usnet_session_abi::record_len(len)];
            rec[..RECORD_HEADER].fill(0);
            rec[0..4].copy_from_slice(&(len as u32).to_le_bytes());
            rec[8..8 + SockAddr::LEN].copy_from_slice(&to.to_bytes());
            assert_eq!(write(&h, 1, &rec), rec.len());
        }
        h.turn();
        h.turn();
        let ring = h.recv(0);
        let mut at = 0;
        for (len, fill) in [(10, 1u8), (300, 2)] {
            let hdr = &ring[at..at + RECORD_HEADER];
            assert_eq!(u32::from_le_bytes(hdr[0..4].try_into().unwrap()), len);
            let from = SockAddr::from_bytes(hdr[8..8 + SockAddr::LEN].try_into().unwrap());
            assert_eq!(from.to_std(), Some((ADDR, 7122).into()));
            let body = &ring[at + RECORD_HEADER..at + RECORD_HEADER + len as usize];
            assert!(body.iter().all(|&b| b == fill), "record of {len}");
            at += usnet_session_abi::record_len(len as usize);
        }
        assert_eq!(at, ring.len(), "two records, nothing else");
        h.finish();
    }

    /// A connection sends from its client's send ring in place: the ring's bytes
    /// go back to the client only as the peer acknowledges them (a retransmission
    /// reads them there), and a close while the connection still holds some lets
    /// it keep them: the slot and its ring are reused at once, scribbled on, and
    /// every byte still arrives once.
    #[test]
    fn a_lent_send_ring_gives_bytes_back_as_they_are_acknowledged() {
        let mut h = Harness::new();
        h.connected_pair(7124);
        let at = h.mem().tx_ring(1);
        let given_back = |h: &Harness| h.mem().region().u64(at.cons).load(Acquire);
        let data: Vec<u8> = (0..3000u32).map(|k| (k * 7) as u8).collect();
        assert_eq!(write(&h, 1, &data), 3000);
        h.turn();
        assert!(h.parts(1).0.sock(1).lent, "the ring is the send buffer");
        assert_eq!(h.parts(1).0.sock(1).tx.position(), 3000, "taken");
        let mut got = Vec::new();
        for _ in 0..20 {
            h.advance(Duration::from_millis(50));
            h.turn();
            got.extend(h.recv(2));
        }
        assert_eq!(got, data);
        assert_eq!(given_back(&h), 3000, "acknowledged: back to the client");

        // The peer stops reading: its windows fill, and the connection holds bytes
        // it cannot send yet, in the ring, which the client cannot write over.
        let mut sent = Vec::new();
        for k in 0..64u32 {
            let (sess, stack) = h.parts(1);
            let h1 = sess.sock(1).handle.unwrap();
            if stack.tcp_info(h1).unwrap().send_queued >= 1000 {
                break;
            }
            let chunk: Vec<u8> = (0..1500u32).map(|j| (k * 31 + j * 3) as u8).collect();
            let n = write(&h, 1, &chunk);
            sent.extend_from_slice(&chunk[..n]);
            h.turn();
        }
        let (sess, stack) = h.parts(1);
        assert!(sess.sock(1).lent, "still lent (the ring never filled)");
        let info = stack.tcp_info(sess.sock(1).handle.unwrap()).unwrap();
        let held = sess.sock(1).tx.unreleased();
        assert!(
            info.send_queued > info.bytes_in_flight as usize,
            "unsent bytes: {info:?}"
        );
        assert_eq!(
            held, info.send_queued as u64,
            "what it holds is in the ring"
        );
        assert_eq!(given_back(&h), 3000 + sent.len() as u64 - held);
        // The client closes: the slot goes at once, the connection keeps its bytes.
        assert_eq!(h.call(op::CLOSE, 1, [0; 6]), 0);
        h.turn();
        assert_eq!(
            h.mem().slot_word(1, slot::STATE).load(Acquire),
            usnet_session_abi::SLOT_FREE
        );
        // The same slot, and ring, for a new socket whose client writes over it.
        assert_eq!(h.call(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]), 1);
        h.send_bytes(1, &[0xee; 4096]);
        let mut got = Vec::new();
        for _ in 0..100 {
            h.advance(Duration::from_millis(50));
            h.turn();
            got.extend(h.recv(2));
        }
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "what the connection held arrives unchanged");
        assert_ne!(
            h.mem().slot_word(2, slot::FLAGS).load(Acquire) & FLAG_RX_EOF,
            0
        );
        h.finish();
    }

    /// Bytes written on a socket that cannot send (not connected) are dropped, as
    /// the kernel drops them: the ring is emptied, nothing is counted as sent.
    #[test]
    fn bytes_on_a_socket_that_cannot_send_are_dropped() {
        let mut h = Harness::new();
        assert_eq!(h.call(op::SOCKET, 0, [KIND_TCP, 0, 0, 0, 0, 0]), 0);
        assert_eq!(write(&h, 0, &[5u8; 100]), 100);
        h.turn();
        let at = h.mem().tx_ring(0);
        let r = h.mem().region();
        assert_eq!(r.u64(at.cons).load(Acquire), 100, "the ring was emptied");
        assert_eq!(h.parts(1).0.stats.bytes_in, 0);
        h.finish();
    }

    /// An `op::SEND` naming a write that the usual drain already gave the stack
    /// whole (its end lies before the ring's read position) takes nothing more and
    /// reports the write taken: the range is the client's, so the server must not
    /// reckon with it as if it lay ahead (found by the `server_session` fuzzer: the
    /// subtraction overflowed, and in a release build asked for an enormous buffer).
    #[test]
    fn a_send_naming_bytes_already_drained_is_reported_taken() {
        let mut h = Harness::new();
        h.connected_pair(7123);
        assert_eq!(write(&h, 1, &[9u8; 100]), 100);
        h.turn();
        assert_eq!(h.parts(1).0.sock(1).tx.position(), 100, "drained");
        assert_eq!(h.call(op::SEND, 1, [0, 50, 0, 0, 0, 0]), 50);
        assert_eq!(h.call(op::SEND, 1, [40, 100, 0, 0, 0, 0]), 60);
        h.turn();
        assert_eq!(h.recv(2), vec![9u8; 100], "each byte sent once");
        h.finish();
    }

    #[test]
    fn dropped_bytes_are_stepped_over_when_mapping_acknowledgements() {
        let mut g = TxGaps::default();
        assert_eq!(g.acked(100, 40), 60, "no gaps: ring and stack agree");
        // Ring 0..100 taken; 100..130 dropped; 130..200 taken.
        g.push(100, 30);
        // The stack holds 90 unacknowledged bytes of the 170 it took: 80 acked.
        assert_eq!(g.acked(200, 90), 80);
        // All of the first 100 acknowledged: the gap right after counts too.
        assert_eq!(g.acked(200, 70), 130);
        assert_eq!(g.acked(200, 50), 150);
        // The passed gap is forgotten, its length kept.
        assert!(g.list.is_empty());
        g.push(200, 10);
        assert_eq!(g.acked(260, 50), 200 + 10, "everything before the new gap");
        assert_eq!(g.acked(260, 0), 260);
    }
}
