//! Priority-aware receive (docs/priority.md; the source document's forced drop and
//! priority control).
//!
//! The priority set S is the top `n` receiving sockets (UDP sockets and TCP
//! listeners) by priority; P are their ports and Q their consumers. A socket's
//! priority is its explicit mark if it has one, else the highest priority among its
//! owner and the owners that talk to it locally (a connected UDP socket or TCP
//! connection whose peer is one of our addresses and a port the owner holds). Ties
//! go to the older socket. S is recomputed when a member closes, when a socket
//! outranks the weakest member, and once per interval (which picks up new local
//! conversations); activation conditions are looked at most once per interval.
//!
//! - Forced drop (mechanism A) lives at the entrance, [`Core::receive`]: while active,
//!   frames whose destination TCP/UDP port (read straight from the headers, no
//!   parsing or checksum) is outside P are dropped with a fixed probability. It
//!   activates when drop 1 happens or the input queue reaches the threshold, and
//!   then drops while a backlog lasts (the input queue at half the threshold or
//!   more), for one interval.
//! - Priority control (mechanism B): when a member's queue passes half its limit
//!   the stack asks for its consumer to be boosted ([`SchedRequest`]); it asks for a
//!   restore when the queue has drained (below a quarter, nothing arrived for
//!   `drain_quiet`), the member left S, or the boost time is up.
//!   The stack stays sans-IO: a hook outside it (usnet-driver's `Booster`) makes
//!   the system calls.

use std::collections::HashMap;
use std::time::Duration;

use usnet_sim::SimRng;

use crate::config::RxPolicy;
use crate::core::Core;
use crate::socket::{Owner, Socket, SocketHandle};
use crate::time::Instant;
use crate::Stack;

/// What the stack asks of the scheduler hook (pids are process or thread ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum SchedRequest {
    /// Raise `pid`'s scheduling priority by `steps` nice steps (from its own value).
    Boost { pid: u32, steps: i32 },
    /// Put `pid` back to the priority it had before its boost.
    Restore { pid: u32 },
}

/// What the embedding layer knows of an owner: the process (or thread) that reads
/// its sockets and its scheduling priority (higher is more important: `-nice`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct OwnerInfo {
    pub pid: Option<u32>,
    pub priority: i32,
}

/// One member of S, as `usnet stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PrioMember {
    pub handle: u64,
    pub port: u16,
    pub priority: i32,
    pub owner: u32,
    /// The consumer a boost goes to, if known.
    pub pid: Option<u32>,
}

/// The state of priority-aware receive, for `usnet stat`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PrioStatus {
    pub forced_drop: bool,
    pub priority: bool,
    pub set_size: usize,
    pub members: Vec<PrioMember>,
    pub ports: Vec<u16>,
    /// Forced drop is dropping now.
    pub forced_drop_active: bool,
    /// Consumers boosted now.
    pub boosted: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Member {
    index: u32,
    gen: u32,
    port: u16,
    priority: i32,
    owner: Owner,
    pid: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Boost {
    pid: u32,
    /// The member whose queue asked for it (its drain ends the boost).
    index: u32,
    until: Instant,
    /// The last datagram queued on that member.
    last_arrival: Instant,
    /// When to look next whether the queue has drained (a timer, so a loop with a
    /// boost in force neither misses the drain nor spins on a past deadline).
    check_at: Instant,
}

/// Per-socket marks, kept beside the slot.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SockMark {
    pub priority: Option<i32>,
    pub consumer: Option<u32>,
}

/// Priority-aware receive state; lives in the core because forced drop runs at
/// the entrance, before the socket table is looked at.
pub(crate) struct Prio {
    pub cfg: RxPolicy,
    threshold: usize,
    /// While active, forced drop drops only with at least this many frames waiting:
    /// the overload that activated it goes on.
    backlog: usize,
    /// P, sorted; tiny (n ports), so a scan beats a map.
    ports: Vec<u16>,
    members: Vec<Member>,
    pub owners: HashMap<Owner, OwnerInfo>,
    /// S must be recomputed before the next use (a member closed, a socket may
    /// outrank one).
    pub dirty: bool,
    next_recompute: Instant,
    /// Forced drop drops until then.
    fd_until: Instant,
    /// The earliest time forced drop may be activated again.
    fd_next_check: Instant,
    /// The current activation came from drop 1 (else from the threshold).
    fd_by_drop1: bool,
    rng: SimRng,
    boosts: Vec<Boost>,
    /// Per consumer: the earliest time it may be boosted again.
    boost_next: HashMap<u32, Instant>,
    pub requests: Vec<SchedRequest>,
}

impl Prio {
    pub fn new(cfg: RxPolicy, input_queue_len: usize, seed: u64) -> Prio {
        let threshold = if cfg.threshold == 0 {
            (input_queue_len / 2).max(1)
        } else {
            cfg.threshold
        };
        Prio {
            cfg,
            threshold,
            backlog: (threshold.min(input_queue_len) / 2).max(1),
            ports: Vec::new(),
            members: Vec::new(),
            owners: HashMap::new(),
            dirty: false,
            next_recompute: Instant::ZERO,
            fd_until: Instant::ZERO,
            fd_next_check: Instant::ZERO,
            fd_by_drop1: false,
            rng: SimRng::new(seed ^ 0x7072_696f_7269_7479),
            boosts: Vec::new(),
            boost_next: HashMap::new(),
            requests: Vec::new(),
        }
    }

    fn interval(&self) -> Duration {
        self.cfg.interval
    }
}

/// The destination port of a TCP or UDP frame, read from fixed offsets (Ethernet,
/// up to two VLAN tags, IPv4 without fragment offset or IPv6 without extension
/// headers). `None` for anything else: such frames are never force-dropped.
pub(crate) fn dst_port(frame: &[u8]) -> Option<u16> {
    let mut off = 12;
    let mut ty = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
    while ty == 0x8100 || ty == 0x88a8 {
        off += 4;
        ty = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
    }
    let ip = frame.get(off + 2..)?;
    let l4 = match ty {
        0x0800 => {
            let ihl = (*ip.first()? & 0x0f) as usize * 4;
            let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x1fff;
            // A later fragment carries no ports.
            if frag != 0 || !matches!(ip.get(9)?, 6 | 17) {
                return None;
            }
            ip.get(ihl..)?
        }
        0x86dd => {
            if !matches!(ip.get(6)?, 6 | 17) {
                return None;
            }
            ip.get(40..)?
        }
        _ => return None,
    };
    Some(u16::from_be_bytes([*l4.get(2)?, *l4.get(3)?]))
}

impl Core {
    /// Forced drop at the entrance, for a frame to `port` (`None`: not TCP/UDP or
    /// not readable cheaply). `full`: the frame meets a full input queue (drop 1).
    /// Returns whether the frame is to be dropped.
    #[inline]
    pub(crate) fn forced_drop(&mut self, port: Option<u16>, full: bool) -> bool {
        let now = self.now;
        let p = &mut self.prio;
        if full || self.input.len() >= p.threshold {
            // Looked at most once per interval, not per packet.
            if now >= p.fd_next_check && now >= p.fd_until {
                let iv = p.interval();
                p.fd_until = now + iv;
                p.fd_next_check = now + iv;
                p.fd_by_drop1 = full;
                self.counters.prio_forced_drop_activations += 1;
            }
        }
        // Active for the interval, dropping while the backlog lasts: a stack that
        // caught up has nothing to save by dropping (the document's "while drop 1
        // is happening").
        if now >= p.fd_until || p.ports.is_empty() || self.input.len() < p.backlog {
            return false;
        }
        match port {
            Some(port) if !p.ports.contains(&port) => {
                if p.rng.chance(p.cfg.drop_probability) {
                    if p.fd_by_drop1 {
                        self.counters.prio_forced_drop_drop1 += 1;
                    } else {
                        self.counters.prio_forced_drop_threshold += 1;
                    }
                    return true;
                }
                false
            }
            _ => false,
        }
    }

    /// A member's queue is above half its limit: ask for a boost of its consumer
    /// (once per consumer per interval, and not while it is boosted).
    pub(crate) fn prio_queue_high(&mut self, index: u32) {
        let now = self.now;
        let p = &mut self.prio;
        let Some(m) = p.members.iter().find(|m| m.index == index) else {
            return;
        };
        let Some(pid) = m.pid else {
            return;
        };
        if p.boosts.iter().any(|b| b.pid == pid) {
            return;
        }
        if p.boost_next.get(&pid).is_some_and(|&t| now < t) {
            return;
        }
        let iv = p.interval();
        p.boost_next.insert(pid, now + iv);
        p.boosts.push(Boost {
            pid,
            index,
            until: now + p.cfg.boost_time,
            last_arrival: now,
            check_at: now + p.cfg.drain_quiet,
        });
        p.requests.push(SchedRequest::Boost {
            pid,
            steps: p.cfg.boost,
        });
        self.counters.prio_boosts += 1;
    }

    /// A datagram was queued on a member that may be boosted: the burst goes on.
    #[inline]
    pub(crate) fn prio_arrival(&mut self, index: u32) {
        let now = self.now;
        for b in self.prio.boosts.iter_mut().filter(|b| b.index == index) {
            b.last_arrival = now;
        }
    }

    /// Ends boosts whose time is up, and those whose queue drained (`drained(index)`:
    /// below a quarter of its limit) with nothing arrived for `drain_quiet`; returns
    /// whether any ended.
    fn prio_expire(&mut self, drained: impl Fn(u32) -> bool) -> bool {
        let now = self.now;
        let p = &mut self.prio;
        let quiet = p.cfg.drain_quiet;
        let before = p.boosts.len();
        let (mut expired, mut emptied) = (0, 0);
        p.boosts.retain_mut(|b| {
            let done = if now >= b.until {
                expired += 1;
                true
            } else if now < b.check_at {
                false
            } else if now >= b.last_arrival + quiet && drained(b.index) {
                emptied += 1;
                true
            } else {
                // Still coming: look again once quiet; quiet but still queued: look
                // again after another quiet time.
                let quiet_at = b.last_arrival + quiet;
                b.check_at = if now < quiet_at {
                    quiet_at
                } else {
                    now + quiet
                };
                false
            };
            if done {
                p.requests.push(SchedRequest::Restore { pid: b.pid });
            }
            !done
        });
        self.counters.prio_restores_timeout += expired;
        self.counters.prio_restores_drained += emptied;
        p.boosts.len() != before
    }

    /// When a boost next runs out, or may end because its queue drained.
    pub(crate) fn prio_at(&self) -> Option<Instant> {
        self.prio
            .boosts
            .iter()
            .map(|b| b.until.min(b.check_at))
            .min()
    }
}

impl Stack {
    /// The slot is a member of S and priority control is on (the cheap test on the
    /// delivery path).
    #[inline]
    pub(crate) fn prio_watch(&self, index: u32) -> bool {
        self.core.prio.cfg.priority
            && self
                .sockets
                .slots
                .get(index as usize)
                .is_some_and(|s| s.prio_member)
    }

    /// Marks `h`'s priority explicitly (higher is more important; a process's
    /// priority is `-nice`), or clears the mark. S is recomputed if it now outranks
    /// a member (or was one).
    pub fn set_socket_priority(
        &mut self,
        h: SocketHandle,
        priority: Option<i32>,
    ) -> Result<(), crate::StackError> {
        let slot = self.slot_mut(h)?;
        slot.mark.priority = priority;
        self.prio_consider(h);
        Ok(())
    }

    /// Names the process or thread that reads `h` (its boosts go there instead of to
    /// the owner's process).
    pub fn set_socket_consumer(
        &mut self,
        h: SocketHandle,
        pid: Option<u32>,
    ) -> Result<(), crate::StackError> {
        let slot = self.slot_mut(h)?;
        slot.mark.consumer = pid;
        let member = slot.prio_member;
        if member {
            self.core.prio.dirty = true;
        }
        Ok(())
    }

    /// Records an owner's consumer process and scheduling priority (a stack server
    /// does this for its clients).
    pub fn set_owner_info(&mut self, owner: Owner, info: OwnerInfo) {
        let old = self.core.prio.owners.insert(owner, info);
        if old != Some(info) {
            self.core.prio.dirty = true;
        }
    }

    /// Forgets an owner (its process is gone); its sockets rank by default.
    pub fn clear_owner_info(&mut self, owner: Owner) {
        if self.core.prio.owners.remove(&owner).is_some() {
            self.core.prio.dirty = true;
        }
    }

    /// The requests for the scheduler hook since the last call.
    pub fn take_sched_requests(&mut self, out: &mut Vec<SchedRequest>) {
        out.append(&mut self.core.prio.requests);
    }

    /// S, P, and what is in force (for `usnet stat` and tests).
    pub fn prio_status(&mut self) -> PrioStatus {
        self.prio_refresh();
        let p = &self.core.prio;
        PrioStatus {
            forced_drop: p.cfg.forced_drop,
            priority: p.cfg.priority,
            set_size: p.cfg.set_size,
            members: p
                .members
                .iter()
                .map(|m| PrioMember {
                    handle: SocketHandle {
                        index: m.index,
                        gen: m.gen,
                    }
                    .raw(),
                    port: m.port,
                    priority: m.priority,
                    owner: m.owner.0,
                    pid: m.pid,
                })
                .collect(),
            ports: p.ports.clone(),
            forced_drop_active: p.cfg.forced_drop && self.core.now < p.fd_until,
            boosted: p.boosts.iter().map(|b| b.pid).collect(),
        }
    }

    fn slot_mut(&mut self, h: SocketHandle) -> Result<&mut crate::socket::Slot, crate::StackError> {
        self.sockets
            .slots
            .get_mut(h.index as usize)
            .filter(|s| s.gen == h.gen && s.sock.is_some())
            .ok_or(crate::StackError::InvalidHandle)
    }

    /// A socket's (port, priority, owner, consumer) if it can be in S.
    fn prio_candidate(&self, index: u32) -> Option<(u16, i32, Owner, Option<u32>)> {
        let slot = self.sockets.slots.get(index as usize)?;
        let port = match slot.sock.as_ref()? {
            Socket::Udp(u) => u.local.port(),
            Socket::TcpListen(l) => l.local.port(),
            _ => return None,
        };
        let info = self.core.prio.owners.get(&slot.owner).copied();
        let priority = slot
            .mark
            .priority
            .unwrap_or_else(|| info.map_or(0, |i| i.priority));
        let pid = slot.mark.consumer.or(info.and_then(|i| i.pid));
        Some((port, priority, slot.owner, pid))
    }

    /// After a bind, a mark or an owner change: recompute S if `h` may now outrank a
    /// member, or was one.
    pub(crate) fn prio_consider(&mut self, h: SocketHandle) {
        if !self.core.prio.cfg.enabled() {
            return;
        }
        let member = self
            .sockets
            .slots
            .get(h.index as usize)
            .is_some_and(|s| s.prio_member);
        let seq = |index: u32| self.sockets.slots.get(index as usize).map(|s| s.seq);
        let outranks = self.prio_candidate(h.index).is_some_and(|(_, pr, ..)| {
            let p = &self.core.prio;
            // Ties go to the older socket, as in the ranking itself.
            p.members.len() < p.cfg.set_size
                || p.members
                    .iter()
                    .any(|m| pr > m.priority || (pr == m.priority && seq(h.index) < seq(m.index)))
        });
        if member || outranks {
            self.core.prio.dirty = true;
        }
    }

    /// Recomputes S if something asked for it; called from `poll` and before S is
    /// shown (cheap when nothing changed).
    pub(crate) fn prio_refresh(&mut self) {
        if !self.core.prio.cfg.enabled() {
            return;
        }
        if self.sockets.prio_dirty {
            self.sockets.prio_dirty = false;
            self.core.prio.dirty = true;
        }
        if self.core.prio.dirty {
            self.prio_recompute();
        }
    }

    /// The once-per-interval work and the boost timers (from `poll`).
    pub(crate) fn prio_poll(&mut self) -> bool {
        if !self.core.prio.cfg.enabled() {
            return false;
        }
        let now = self.core.now;
        if now >= self.core.prio.next_recompute {
            // New local conversations change owners' priorities without an event.
            self.core.prio.next_recompute = now + self.core.prio.interval();
            self.core.prio.dirty = true;
        }
        self.prio_refresh();
        let sockets = &self.sockets;
        self.core.prio_expire(|index| {
            // Only UDP sockets ask for boosts; anything else counts as drained.
            sockets
                .udp_at(index)
                .is_none_or(|u| u.rx_queued_bytes * 4 < u.recv_buffer)
        })
    }

    /// Ranks every candidate: explicit mark, else the best of its owner and the
    /// owners talking to it locally; ties to the older socket.
    fn prio_recompute(&mut self) {
        self.core.prio.dirty = false;
        self.core.counters.prio_set_recomputed += 1;
        let n = self.core.prio.cfg.set_size;
        // Owners that talk to an owner locally lend it their priority: first who
        // holds each port, then every local conversation (one pass each).
        let mut bound: HashMap<u16, Vec<(std::net::IpAddr, Owner)>> = HashMap::new();
        for slot in &self.sockets.slots {
            let local = match &slot.sock {
                Some(Socket::Udp(u)) => u.local,
                Some(Socket::TcpListen(l)) => l.local,
                _ => continue,
            };
            bound
                .entry(local.port())
                .or_default()
                .push((local.ip(), slot.owner));
        }
        let mut lent: HashMap<Owner, i32> = HashMap::new();
        let owner_prio = |o: &Owner| self.core.prio.owners.get(o).map_or(0, |i| i.priority);
        for slot in &self.sockets.slots {
            let remote = match &slot.sock {
                Some(Socket::Udp(u)) => match u.remote {
                    Some(r) => r,
                    None => continue,
                },
                Some(Socket::TcpConn(c)) if !c.orphan => c.remote,
                _ => continue,
            };
            if !self.core.is_local_addr(remote.ip()) {
                continue;
            }
            let peer = bound.get(&remote.port()).and_then(|v| {
                v.iter()
                    .find(|(ip, _)| ip.is_unspecified() || *ip == remote.ip())
                    .map(|&(_, o)| o)
            });
            if let Some(peer) = peer.filter(|&p| p != slot.owner) {
                let e = lent.entry(peer).or_insert(i32::MIN);
                *e = (*e).max(owner_prio(&slot.owner));
            }
        }
        let mut cands: Vec<(i32, u64, Member)> = Vec::new();
        for (i, slot) in self.sockets.slots.iter().enumerate() {
            let Some((port, mut priority, owner, pid)) = self.prio_candidate(i as u32) else {
                continue;
            };
            if slot.mark.priority.is_none() {
                if let Some(&l) = lent.get(&owner) {
                    priority = priority.max(l);
                }
            }
            let m = Member {
                index: i as u32,
                gen: slot.gen,
                port,
                priority,
                owner,
                pid,
            };
            cands.push((priority, slot.seq, m));
        }
        cands.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        cands.truncate(n);
        for m in &self.core.prio.members {
            if let Some(s) = self.sockets.slots.get_mut(m.index as usize) {
                s.prio_member = false;
            }
        }
        let members: Vec<Member> = cands.into_iter().map(|c| c.2).collect();
        for m in &members {
            self.sockets.slots[m.index as usize].prio_member = true;
        }
        // Boosts of sockets that left S end now.
        let p = &mut self.core.prio;
        let mut ended = 0;
        p.boosts.retain(|b| {
            let keep = members
                .iter()
                .any(|m| m.index == b.index && m.pid == Some(b.pid));
            if !keep {
                p.requests.push(SchedRequest::Restore { pid: b.pid });
                ended += 1;
            }
            keep
        });
        self.core.counters.prio_restores_left_set += ended;
        let mut ports: Vec<u16> = members.iter().map(|m| m.port).collect();
        ports.sort_unstable();
        ports.dedup();
        p.ports = ports;
        p.members = members;
    }
}

#[cfg(test)]
mod tests {
    use super::dst_port;

    fn frame(ethertype: &[u8], l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(ethertype);
        f.extend_from_slice(l3);
        f
    }

    fn ipv4(proto: u8, frag: u16, ihl: u8) -> Vec<u8> {
        let mut ip = vec![0u8; ihl as usize * 4];
        ip[0] = 0x40 | ihl;
        ip[6..8].copy_from_slice(&frag.to_be_bytes());
        ip[9] = proto;
        ip.extend_from_slice(&[0x13, 0x88, 0x1f, 0x41, 0, 8, 0, 0]); // 5000 → 8001
        ip
    }

    #[test]
    fn reads_the_destination_port_from_fixed_offsets() {
        assert_eq!(dst_port(&frame(&[8, 0], &ipv4(17, 0, 5))), Some(8001));
        assert_eq!(dst_port(&frame(&[8, 0], &ipv4(6, 0x4000, 6))), Some(8001));
        // VLAN tags are skipped.
        let mut tagged = vec![0x81, 0, 0, 7, 0x88, 0xa8, 0, 9, 8, 0];
        tagged.extend_from_slice(&ipv4(17, 0, 5));
        assert_eq!(dst_port(&frame(&[], &tagged)), Some(8001));
        let mut v6 = vec![0u8; 40];
        v6[0] = 0x60;
        v6[6] = 17;
        v6.extend_from_slice(&[0, 1, 0, 53]);
        assert_eq!(dst_port(&frame(&[0x86, 0xdd], &v6)), Some(53));
        // Not readable cheaply: never force-dropped.
        assert_eq!(
            dst_port(&frame(&[8, 0], &ipv4(17, 0x0010, 5))),
            None,
            "a later fragment"
        );
        assert_eq!(dst_port(&frame(&[8, 0], &ipv4(1, 0, 5))), None, "ICMP");
        v6[6] = 44;
        assert_eq!(
            dst_port(&frame(&[0x86, 0xdd], &v6)),
            None,
            "an extension header"
        );
        assert_eq!(dst_port(&frame(&[8, 6], &[0; 28])), None, "ARP");
        assert_eq!(
            dst_port(&frame(&[8, 0], &ipv4(17, 0, 5)[..21])),
            None,
            "truncated"
        );
        assert_eq!(dst_port(&[0u8; 5]), None);
    }
}
