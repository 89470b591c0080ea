//! `epoll_create`/`epoll_ctl`/`epoll_wait` over the backend's descriptors.
//!
//! An epoll instance is a real kernel descriptor number (a memfd, as sockets) with an
//! interest list. Readiness is `Backend::revents` (the `EPOLL*` bits equal the
//! `POLL*` ones). Level-triggered items report while ready. Edge-triggered
//! (`EPOLLET`) items report when a wake-up happened since their last report: the
//! stack's ready list (`Stack::take_ready`: data or a FIN arrived, send space was
//! freed, the connection ended) counts one per socket; adding or modifying an item
//! counts as one, as Linux queues a ready item at `EPOLL_CTL_ADD`/`MOD`.
//! `EPOLLONESHOT` disarms an item after one report until `EPOLL_CTL_MOD`;
//! `EPOLLEXCLUSIVE` changes nothing with one waiter.

use std::collections::BTreeMap;
use std::ffi::c_int;

use super::{Backend, Kind, RealFd, Res};
use usnet_stack::SocketHandle;

#[derive(Debug)]
pub(crate) struct Epoll {
    pub(crate) real: RealFd,
    items: BTreeMap<c_int, Item>,
}

#[derive(Debug, Clone, Copy)]
struct Item {
    events: u32,
    data: u64,
    /// The socket's wake-up count at the last report (edge-triggered).
    seen: u64,
    /// A report is owed at the next wait if ready (after ADD/MOD).
    fresh: bool,
    /// EPOLLONESHOT fired: no more reports until MOD.
    disarmed: bool,
}

const ET: u32 = libc::EPOLLET as u32;
const ONESHOT: u32 = libc::EPOLLONESHOT as u32;

impl Backend {
    pub fn epoll_create(&mut self) -> Res<c_int> {
        let real = RealFd::new()?;
        let fd = real.fd;
        self.epolls.insert(
            fd,
            Epoll {
                real,
                items: BTreeMap::new(),
            },
        );
        Ok(fd)
    }

    /// The wake-up count of `fd`'s socket (0 for one without a stack socket).
    fn wakes_of(&self, fd: c_int) -> u64 {
        match self.fds.get(&fd).map(|f| f.kind) {
            Some(Kind::Conn(h) | Kind::Listen(h)) => self.wakes.get(&h).copied().unwrap_or(0),
            _ => 0,
        }
    }

    pub fn epoll_ctl(
        &mut self,
        epfd: c_int,
        op: c_int,
        fd: c_int,
        ev: Option<(u32, u64)>,
    ) -> Res<c_int> {
        if !self.epolls.contains_key(&epfd) {
            return Err(libc::EBADF);
        }
        if !self.fds.contains_key(&fd) {
            return Err(if self.epolls.contains_key(&fd) {
                libc::EINVAL
            } else {
                libc::EBADF
            });
        }
        self.pump();
        let seen = self.wakes_of(fd);
        let ep = self.epolls.get_mut(&epfd).ok_or(libc::EBADF)?;
        match op {
            libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD => {
                let (events, data) = ev.ok_or(libc::EFAULT)?;
                let present = ep.items.contains_key(&fd);
                if op == libc::EPOLL_CTL_ADD && present {
                    return Err(libc::EEXIST);
                }
                if op == libc::EPOLL_CTL_MOD && !present {
                    return Err(libc::ENOENT);
                }
                ep.items.insert(
                    fd,
                    Item {
                        events,
                        data,
                        seen,
                        fresh: true,
                        disarmed: false,
                    },
                );
            }
            libc::EPOLL_CTL_DEL => {
                ep.items.remove(&fd).ok_or(libc::ENOENT)?;
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(0)
    }

    /// One pass of `epoll_wait`: up to `max` ready items as `(events, data)`.
    pub fn epoll_collect(&mut self, epfd: c_int, max: usize) -> Res<Vec<(u32, u64)>> {
        self.pump();
        let fds: Vec<c_int> = self
            .epolls
            .get(&epfd)
            .ok_or(libc::EBADF)?
            .items
            .keys()
            .copied()
            .collect();
        let mut out = Vec::new();
        for fd in fds {
            if out.len() >= max {
                break;
            }
            let wakes = self.wakes_of(fd);
            let rev = if self.fds.contains_key(&fd) {
                self.revents(fd) as u16 as u32
            } else {
                0
            };
            let ep = self.epolls.get_mut(&epfd).ok_or(libc::EBADF)?;
            let Some(it) = ep.items.get_mut(&fd) else {
                continue;
            };
            if it.disarmed {
                continue;
            }
            let always = (libc::EPOLLERR | libc::EPOLLHUP) as u32;
            let ready = rev & (it.events | always);
            let edge = it.events & ET != 0;
            let due = !edge || it.fresh || wakes != it.seen;
            if edge {
                it.fresh = false;
                it.seen = wakes;
            }
            if ready != 0 && due {
                if it.events & ONESHOT != 0 {
                    it.disarmed = true;
                }
                out.push((ready, it.data));
            }
        }
        Ok(out)
    }

    /// Counts the stack's wake-ups per socket (after the stack ran), and a
    /// zero-copy completion that reached a socket's error queue as one (Linux
    /// reports it with `sk_error_report`, a wake-up).
    pub(crate) fn count_wakes(&mut self) {
        let mut ready = Vec::new();
        self.stack_mut().take_ready(&mut ready);
        let zc: Vec<(c_int, SocketHandle)> = self
            .fds
            .iter()
            .filter(|(_, f)| f.zc.has_inflight())
            .filter_map(|(&fd, f)| match f.kind {
                Kind::Conn(h) => Some((fd, h)),
                _ => None,
            })
            .collect();
        for (fd, h) in zc {
            let before = self.fds[&fd].zc.queued();
            self.zerocopy_pending(fd);
            if self.fds[&fd].zc.queued() != before {
                ready.push(h);
            }
        }
        for h in ready {
            *self.wakes.entry(h).or_insert(0) += 1;
        }
    }

    /// Closes an epoll descriptor; false if `fd` is not one.
    pub(crate) fn close_epoll(&mut self, fd: c_int) -> bool {
        match self.epolls.remove(&fd) {
            Some(ep) => {
                ep.real.close();
                true
            }
            None => {
                for ep in self.epolls.values_mut() {
                    ep.items.remove(&fd);
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Options;
    use super::*;

    const OUT: u32 = libc::EPOLLOUT as u32;
    const HUP: u32 = libc::EPOLLHUP as u32;

    #[test]
    fn level_edge_and_oneshot_reports() {
        let mut b = Backend::new(&Options::default()).unwrap();
        // A fresh socket is always POLLOUT|POLLHUP: readiness that never changes.
        let lt = b.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        let et = b.socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        let ep = b.epoll_create().unwrap();
        assert_eq!(
            b.epoll_ctl(ep, libc::EPOLL_CTL_ADD, lt, Some((OUT, 1))),
            Ok(0)
        );
        assert_eq!(
            b.epoll_ctl(ep, libc::EPOLL_CTL_ADD, lt, Some((OUT, 1))),
            Err(libc::EEXIST)
        );
        assert_eq!(
            b.epoll_ctl(ep, libc::EPOLL_CTL_MOD, et, Some((OUT, 2))),
            Err(libc::ENOENT)
        );
        assert_eq!(
            b.epoll_ctl(ep, libc::EPOLL_CTL_ADD, 999, Some((OUT, 2))),
            Err(libc::EBADF)
        );
        assert_eq!(
            b.epoll_ctl(lt, libc::EPOLL_CTL_ADD, et, Some((OUT, 2))),
            Err(libc::EBADF)
        );
        assert_eq!(
            b.epoll_ctl(ep, libc::EPOLL_CTL_ADD, et, Some((OUT | ET, 2))),
            Ok(0)
        );
        // Level-triggered reports every time; edge-triggered once after ADD. Events
        // come in descriptor order, and which of the two numbers is lower depends on
        // what other tests of this process closed meanwhile: compare them sorted.
        let sorted = |r: Res<Vec<(u32, u64)>>| {
            r.map(|mut v| {
                v.sort_by_key(|e| e.1);
                v
            })
        };
        assert_eq!(
            sorted(b.epoll_collect(ep, 8)),
            Ok(vec![(OUT | HUP, 1), (OUT | HUP, 2)])
        );
        assert_eq!(b.epoll_collect(ep, 8), Ok(vec![(OUT | HUP, 1)]));
        assert_eq!(
            b.epoll_collect(ep, 1),
            Ok(vec![(OUT | HUP, 1)]),
            "at most max"
        );
        // MOD re-arms an edge; ONESHOT reports once until the next MOD.
        assert_eq!(
            b.epoll_ctl(ep, libc::EPOLL_CTL_MOD, et, Some((OUT | ET, 3))),
            Ok(0)
        );
        assert_eq!(
            b.epoll_ctl(ep, libc::EPOLL_CTL_MOD, lt, Some((OUT | ONESHOT, 4))),
            Ok(0)
        );
        assert_eq!(
            sorted(b.epoll_collect(ep, 8)),
            Ok(vec![(OUT | HUP, 3), (OUT | HUP, 4)])
        );
        assert_eq!(b.epoll_collect(ep, 8), Ok(vec![]));
        // DEL, and closing a socket removes it from the interest list.
        assert_eq!(
            b.epoll_ctl(ep, libc::EPOLL_CTL_MOD, lt, Some((OUT, 5))),
            Ok(0)
        );
        assert_eq!(b.close(lt), Ok(()));
        assert_eq!(b.epoll_ctl(ep, libc::EPOLL_CTL_DEL, et, None), Ok(0));
        assert_eq!(b.epoll_collect(ep, 8), Ok(vec![]));
        assert_eq!(b.close(ep), Ok(()));
        assert_eq!(b.epoll_collect(ep, 8), Err(libc::EBADF));
    }
}
