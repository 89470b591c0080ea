//! `SO_TIMESTAMPING` transmit timestamps (Linux
//! `Documentation/networking/timestamping.rst`) for TCP as Linux reports them:
//! a send marks its last byte (`tcp_tx_timestamp` puts the key on the buffer that
//! holds it); when that byte first leaves, `SCM_TSTAMP_SCHED` (`TX_SCHED`) and
//! `SCM_TSTAMP_SND` (`TX_SOFTWARE`) wait on the error queue, and when the peer
//! acknowledges it, `SCM_TSTAMP_ACK` (`TX_ACK`). Each carries the virtual time it
//! happened at and, with `OPT_ID`, the byte's offset from `snd_una` at the time the
//! option was set (`OPT_ID_TCP`: from `write_seq`). The link is software only: the
//! scheduler and the driver see a segment at the same instant.
//!
//! This is the bookkeeping over byte counts and times, with no clock and no
//! socket: the stack server feeds it the bytes a connection took, sent and had
//! acknowledged, and its clock's nanoseconds.

use std::collections::VecDeque;

use crate::StackError;

pub const TX_SOFTWARE: u32 = 1 << 1;
pub const SOFTWARE: u32 = 1 << 4;
pub const OPT_ID: u32 = 1 << 7;
pub const TX_SCHED: u32 = 1 << 8;
pub const TX_ACK: u32 = 1 << 9;
pub const OPT_TSONLY: u32 = 1 << 11;
pub const OPT_ID_TCP: u32 = 1 << 16;
/// Linux's `SOF_TIMESTAMPING_MASK` (through `OPT_RX_FILTER`, 6.x).
pub const MASK: u32 = (1 << 18) - 1;

/// `SCM_TSTAMP_*`, the kind in `ee_info`.
pub const SCM_TSTAMP_SND: u32 = 0;
pub const SCM_TSTAMP_SCHED: u32 = 1;
pub const SCM_TSTAMP_ACK: u32 = 2;

/// One report on the error queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// `SCM_TSTAMP_*`.
    pub info: u32,
    /// `ee_data`: the key (0 without `OPT_ID`).
    pub key: u32,
    /// When it happened, in the caller's unit (None when the socket asked for no
    /// software stamps).
    pub at: Option<u64>,
    /// No payload comes with it (`OPT_TSONLY`), so no `MSG_TRUNC`.
    pub tsonly: bool,
}

/// A socket's timestamping state.
#[derive(Debug, Default)]
pub struct TxStamps {
    /// The `SOF_TIMESTAMPING_*` flags set.
    pub flags: u32,
    /// The byte count the keys count from (`OPT_ID`).
    base: u64,
    /// Sends whose last byte waits to be sent or acknowledged: (bytes written
    /// through it, sent yet).
    marks: VecDeque<(u64, bool)>,
    queue: VecDeque<Stamp>,
}

impl TxStamps {
    /// `setsockopt(SO_TIMESTAMPING)`; `acked` and `written`: bytes acknowledged and
    /// queued so far (`snd_una` and `write_seq`).
    pub fn set(&mut self, flags: u32, acked: u64, written: u64) -> Result<(), StackError> {
        if flags & !MASK != 0 {
            return Err(StackError::InvalidInput);
        }
        if flags & OPT_ID != 0 && self.flags & OPT_ID == 0 {
            self.base = if flags & OPT_ID_TCP != 0 {
                written
            } else {
                acked
            };
        }
        self.flags = flags;
        Ok(())
    }

    /// Whether the socket asked for any transmit report (then each send's last
    /// byte is marked).
    pub fn wants_tx(&self) -> bool {
        self.flags & (TX_SCHED | TX_SOFTWARE | TX_ACK) != 0
    }

    /// A send that queued bytes through `written`: its last byte is marked.
    pub fn record(&mut self, written: u64) {
        if self.wants_tx() && written > 0 {
            self.marks.push_back((written, false));
        }
    }

    /// Whether a send waits for a report.
    pub fn marked(&self) -> bool {
        !self.marks.is_empty()
    }

    fn stamp(&mut self, info: u32, end: u64, now: u64) {
        let key = if self.flags & OPT_ID != 0 {
            end.wrapping_sub(1).wrapping_sub(self.base) as u32
        } else {
            0
        };
        let at = (self.flags & SOFTWARE != 0).then_some(now);
        let tsonly = self.flags & OPT_TSONLY != 0;
        self.queue.push_back(Stamp {
            info,
            key,
            at,
            tsonly,
        });
    }

    /// The connection has sent bytes through `sent` and the peer acknowledged
    /// them through `acked` (`None`: the connection is gone) at `now`.
    pub fn progress(&mut self, sent: u64, acked: Option<u64>, now: u64) {
        let Some(acked) = acked else {
            self.marks.clear();
            return;
        };
        let mut i = 0;
        while i < self.marks.len() {
            let (end, was_sent) = self.marks[i];
            if !was_sent && end <= sent {
                self.marks[i].1 = true;
                if self.flags & TX_SCHED != 0 {
                    self.stamp(SCM_TSTAMP_SCHED, end, now);
                }
                if self.flags & TX_SOFTWARE != 0 {
                    self.stamp(SCM_TSTAMP_SND, end, now);
                }
            }
            if end <= acked && self.marks[i].1 {
                if self.flags & TX_ACK != 0 {
                    self.stamp(SCM_TSTAMP_ACK, end, now);
                }
                self.marks.remove(i);
                continue;
            }
            i += 1;
        }
    }

    pub fn queued(&self) -> bool {
        !self.queue.is_empty()
    }

    pub fn take(&mut self) -> Option<Stamp> {
        self.queue.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u32 = TX_SCHED | TX_SOFTWARE | TX_ACK | SOFTWARE | OPT_ID;

    #[test]
    fn the_last_byte_of_each_send_is_stamped_when_sent_and_when_acked() {
        let mut t = TxStamps::default();
        t.set(ALL, 0, 0).unwrap();
        t.record(2000);
        t.record(4000);
        t.progress(4000, Some(0), 10);
        t.progress(4000, Some(2000), 20);
        t.progress(4000, Some(4000), 30);
        let got: Vec<(u32, u32, Option<u64>)> = std::iter::from_fn(|| t.take())
            .map(|s| (s.info, s.key, s.at))
            .collect();
        assert_eq!(
            got,
            [
                (SCM_TSTAMP_SCHED, 1999, Some(10)),
                (SCM_TSTAMP_SND, 1999, Some(10)),
                (SCM_TSTAMP_SCHED, 3999, Some(10)),
                (SCM_TSTAMP_SND, 3999, Some(10)),
                (SCM_TSTAMP_ACK, 1999, Some(20)),
                (SCM_TSTAMP_ACK, 3999, Some(30)),
            ]
        );
    }

    #[test]
    fn only_the_last_byte_counts_and_keys_start_at_snd_una() {
        let mut t = TxStamps::default();
        // 100 bytes acknowledged, 150 written when the option is set.
        t.set(ALL, 100, 150).unwrap();
        t.record(11150);
        t.progress(10150, Some(150), 10);
        assert!(!t.queued(), "the send's last byte is not out yet");
        t.progress(11150, Some(10150), 20);
        let s = t.take().unwrap();
        assert_eq!((s.info, s.key, s.at), (SCM_TSTAMP_SCHED, 11049, Some(20)));
        // OPT_ID_TCP counts from write_seq instead.
        let mut t = TxStamps::default();
        t.set(ALL | OPT_ID_TCP, 100, 150).unwrap();
        t.record(151);
        t.progress(151, Some(100), 1);
        assert_eq!(t.take().unwrap().key, 0);
    }

    #[test]
    fn flags_choose_the_reports() {
        let mut t = TxStamps::default();
        t.set(TX_ACK | OPT_TSONLY, 0, 0).unwrap();
        t.record(10);
        t.progress(10, Some(10), 5);
        let s = t.take().unwrap();
        assert_eq!(
            (s.info, s.key, s.at, s.tsonly),
            (SCM_TSTAMP_ACK, 0, None, true)
        );
        assert!(t.take().is_none());
        assert_eq!(t.set(1 << 30, 0, 0), Err(StackError::InvalidInput));
        // Without a transmit flag nothing is marked; a closed connection drops marks.
        let mut t = TxStamps::default();
        t.record(10);
        assert!(t.marks.is_empty());
        t.set(TX_ACK, 0, 0).unwrap();
        t.record(10);
        t.progress(0, None, 1);
        assert!(t.marks.is_empty() && !t.queued());
    }
}
