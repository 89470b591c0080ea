//! One wait for a loop: sleep until the device may have a frame, its waker rang, any
//! of the loop's other doorbells rang (a stack server's clients), or a deadline.
//!
//! A device says what it sleeps on ([`Device::prepare_wait`]): fds that turn
//! readable (TAP, AF_PACKET: the device fd and its waker's eventfd) or a futex bell in
//! shared memory (the shm link, the emulated NIC's interrupt line). [`wait_device`]
//! adds the loop's doorbells and sleeps once: `ppoll` when everything is an fd,
//! `futex_waitv` when everything is a futex bell. A loop picks doorbells of its
//! device's kind (an eventfd next to a TAP, a futex bell next to a shm link); a mix
//! cannot be slept on in one system call and is refused.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use usnet_shm::{EventFd, FutexBell};

use crate::Device;

/// The two kinds of things a device sleeps on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind {
    /// Readable fds (ppoll).
    Fd,
    /// A futex bell in shared memory (futex_waitv).
    Bell,
}

/// What a device sleeps on.
#[derive(Debug, Clone)]
pub enum WaitSpec {
    /// A frame or a wake-up is already there: do not sleep.
    Ready,
    /// Readable means a frame may be there (`dev`, shared with the device so a loop
    /// may sleep on it without holding the device) or the device's waker rang
    /// (`waker`, drained when it woke the sleeper).
    Fds {
        dev: Arc<OwnedFd>,
        waker: Option<Arc<EventFd>>,
    },
    /// A futex bell: sleep while its `seq` still equals `seen`, read before the device
    /// last looked for frames.
    Bell { bell: FutexBell, seen: u32 },
}

/// A device's [`WaitSpec`] and how long it may sleep at most (a fault injector
/// holding delayed frames wants a turn when they are due).
#[derive(Debug, Clone)]
pub struct WaitPlan {
    pub spec: WaitSpec,
    pub within: Option<Duration>,
}

impl WaitPlan {
    pub fn ready() -> Self {
        WaitPlan {
            spec: WaitSpec::Ready,
            within: None,
        }
    }
    pub fn fds(dev: Arc<OwnedFd>, waker: Option<Arc<EventFd>>) -> Self {
        WaitPlan {
            spec: WaitSpec::Fds { dev, waker },
            within: None,
        }
    }
    pub fn bell(bell: FutexBell, seen: u32) -> Self {
        WaitPlan {
            spec: WaitSpec::Bell { bell, seen },
            within: None,
        }
    }
}

/// A loop's own doorbell, waited on next to its device.
#[derive(Debug, Clone, Copy)]
pub enum Doorbell<'a> {
    /// Readable when rung (an eventfd).
    Fd(BorrowedFd<'a>),
    /// A futex bell and the `seq` its owner read before it last looked for work.
    Bell(&'a FutexBell, u32),
}

/// Sleeps until `dev` may have a frame or its waker rang, any of `extra` rang, or
/// `timeout` (or the device's own limit) passes. `extra_ready` is the loop's re-check
/// of its other work after it announced itself on futex bells (fd doorbells need
/// none: they stay readable). It may return early; callers loop.
pub fn wait_device(
    dev: &mut dyn Device,
    extra: &[Doorbell<'_>],
    mut extra_ready: impl FnMut() -> bool,
    timeout: Duration,
) -> std::io::Result<()> {
    let plan = dev.prepare_wait();
    sleep_on(plan, extra, || dev.rx_ready() || extra_ready(), timeout)
}

/// The sleeping half of [`wait_device`], for a loop that prepared the plan while it
/// held the device (under a lock) and sleeps without it. `ready` re-checks the
/// device and the loop's other work after announcing on futex bells.
pub fn sleep_on(
    plan: WaitPlan,
    extra: &[Doorbell<'_>],
    ready: impl FnOnce() -> bool,
    timeout: Duration,
) -> std::io::Result<()> {
    let timeout = plan.within.map_or(timeout, |w| w.min(timeout));
    if timeout.is_zero() {
        return Ok(());
    }
    match plan.spec {
        WaitSpec::Ready => Ok(()),
        WaitSpec::Fds { dev, waker } => {
            let mut fds: Vec<BorrowedFd<'_>> = Vec::with_capacity(2 + extra.len());
            fds.push(dev.as_fd());
            if let Some(w) = &waker {
                fds.push(w.as_fd());
            }
            for d in extra {
                match d {
                    Doorbell::Fd(fd) => fds.push(*fd),
                    Doorbell::Bell(..) => return Err(mixed()),
                }
            }
            let r = usnet_shm::poll_fds(&fds, timeout)?;
            if let Some(w) = &waker {
                // Drained after the wake-up, never before the sleep: a ring that came
                // before the poll made it return at once.
                if r.contains(1) {
                    w.drain();
                }
            }
            Ok(())
        }
        WaitSpec::Bell { bell, seen } => {
            let mut bells: Vec<(&FutexBell, u32)> = Vec::with_capacity(1 + extra.len());
            bells.push((&bell, seen));
            for d in extra {
                match d {
                    Doorbell::Bell(b, s) => bells.push((b, *s)),
                    Doorbell::Fd(_) => return Err(mixed()),
                }
            }
            usnet_shm::sleep_many(&bells, ready, timeout).map(|_| ())
        }
    }
}

fn mixed() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "cannot sleep on fds and futex bells at once: use doorbells of the device's kind",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::{ShmConfig, ShmDevice};
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::time::Instant;
    use usnet_pool::{PacketPool, PoolConfig};
    use usnet_shm::Region;

    fn link(tag: &str) -> (ShmDevice, ShmDevice) {
        let n = format!("w{}-{tag}", std::process::id());
        let a = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        let b = ShmDevice::open(&n, &ShmConfig::default()).unwrap();
        (a, b)
    }

    fn loop_bell() -> FutexBell {
        let r = Arc::new(Region::create_memfd(c"loop-bell", 4096, false).unwrap());
        FutexBell::new(r, 0, 64).unwrap()
    }

    #[test]
    fn a_loop_bell_ends_the_wait_on_a_shm_device() {
        let (mut a, _b) = link("bell");
        let bell = loop_bell();
        let ringer = bell.clone();
        let th = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            ringer.notify();
        });
        let t = Instant::now();
        let seen = bell.seq();
        wait_device(
            &mut a,
            &[Doorbell::Bell(&bell, seen)],
            || false,
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "the loop's bell woke it"
        );
        th.join().unwrap();
        // The loop's own re-check after announcing: no sleep at all.
        let t = Instant::now();
        let seen = bell.seq();
        wait_device(
            &mut a,
            &[Doorbell::Bell(&bell, seen)],
            || true,
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_frame_from_the_peer_ends_the_wait_and_mixing_kinds_is_refused() {
        let (mut a, mut b) = link("frame");
        let bell = loop_bell();
        let mut pool = PacketPool::new(&PoolConfig::default()).unwrap();
        let th = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut pool = PacketPool::new(&PoolConfig::default()).unwrap();
            let f = pool.alloc_from(&[0xffu8; 60]).unwrap();
            let mut q = VecDeque::from([f]);
            b.tx_burst(&mut pool, &mut q).unwrap();
            b
        });
        let t = Instant::now();
        let seen = bell.seq();
        wait_device(
            &mut a,
            &[Doorbell::Bell(&bell, seen)],
            || false,
            Duration::from_secs(5),
        )
        .unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "the peer's frame woke it"
        );
        let _b = th.join().unwrap();
        let mut out = Vec::new();
        assert_eq!(a.rx_burst(&mut pool, &mut out, 8).unwrap(), 1);
        for f in out {
            pool.free(f);
        }
        // The frame moved the bell: the next prepare says "ready" once.
        assert!(matches!(a.prepare_wait().spec, WaitSpec::Ready));
        let ev = EventFd::new().unwrap();
        let e = wait_device(
            &mut a,
            &[Doorbell::Fd(ev.as_fd())],
            || false,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
    }
}
