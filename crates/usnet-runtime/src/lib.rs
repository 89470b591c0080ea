//! Runs a sans-IO [`Stack`] on a real [`Device`] for applications in this process: a
//! poll thread turns the shared [`Driver`] (frames in, protocol work, services, frames
//! out); applications use blocking (or non-blocking) sockets from any thread; a
//! control socket lets `usnet stat` and `usnet ping` talk to a running stack.
//!
//! Locking: this crate is the mutex-and-condvar facade on top of the lock-free
//! driver. One mutex guards the driver (stack and device). The poll thread holds it
//! for one turn and for preparing its sleep (the device says what it sleeps on), then
//! sleeps without it; application threads hold it for one socket call. A condition
//! variable wakes blocked sockets; the device's waker wakes the poll thread after a
//! send.

mod sockets;
mod tcp;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use usnet_driver::{Clock, Driver, SystemClock};
use usnet_link::{Device, DeviceStats, LinkState, Waker};
use usnet_stack::{ConfigError, Instant, Stack, StackConfig};

pub use sockets::{PingSocket, UdpSocket};
pub use tcp::{TcpListener, TcpStream};
/// Services (echo, discard, chargen, HTTP) run in the poll loop with `add_service`.
pub use usnet_services::{chargen_line, Service, ServiceKind};

/// Tuning of the poll loop.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Frames taken from the device per burst.
    pub burst: usize,
    /// How long the poll thread keeps spinning after its last work before it sleeps
    /// in the device's `wait` (trades a core for latency).
    pub spin: Duration,
    /// Kernel-like receive backlog ([`Driver::set_backlog`]); on by itself when the
    /// stack's receive policy is on.
    pub backlog: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            burst: 64,
            spin: Duration::from_micros(50),
            backlog: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot start the poll thread: {0}")]
    Thread(std::io::Error),
    #[error("{0}")]
    Device(std::io::Error),
}

pub(crate) struct Inner {
    /// The stack and its device, turned by the poll thread.
    pub driver: Driver<Box<dyn Device>>,
    pub services: Vec<Box<dyn Service>>,
    /// Threads blocked on the condition variable (so the poll loop only notifies
    /// when someone listens).
    pub waiters: usize,
    pub device_stats: DeviceStats,
    pub link_state: LinkState,
    /// Set when the poll thread stopped on a device error.
    pub failed: Option<String>,
}

impl Inner {
    pub fn stack(&mut self) -> &mut Stack {
        self.driver.stack_mut()
    }
}

pub(crate) struct Shared {
    pub inner: Mutex<Inner>,
    pub cond: Condvar,
    pub waker: Waker,
    pub stop: AtomicBool,
    pub clock: SystemClock,
    pub device_name: String,
}

impl Shared {
    pub fn now(&self) -> Instant {
        self.clock.now()
    }
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic in another thread while holding the lock leaves the stack in a
        // consistent state between calls, so continue with the data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running stack. Cloning gives another handle to the same stack.
#[derive(Clone)]
pub struct NetStack {
    pub(crate) shared: Arc<Shared>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl NetStack {
    /// Starts a stack on `device`. The MTU is the device's unless the configuration
    /// asks for less; offload use follows the device's capabilities.
    pub fn start(
        device: Box<dyn Device>,
        mut cfg: StackConfig,
        rt: RuntimeConfig,
    ) -> Result<NetStack, RuntimeError> {
        usnet_driver::fit_to_device(&mut cfg, device.caps());
        // Mechanism B needs the right to raise priorities; without it, one line
        // and the stack does not ask.
        let booster = if cfg.rx_policy.priority {
            match usnet_driver::Booster::system(None) {
                Ok(b) => Some(b),
                Err(why) => {
                    eprintln!("usnet: {why}");
                    cfg.rx_policy.priority = false;
                    None
                }
            }
        } else {
            None
        };
        let backlog = rt.backlog || cfg.rx_policy.enabled();
        let stack = Stack::new(cfg)?;
        let clock = SystemClock::new();
        let waker = device.waker();
        let device_name = device.name().to_string();
        let mut driver = Driver::new(stack, device, clock);
        driver.bind_device().map_err(RuntimeError::Device)?;
        driver.set_burst(rt.burst);
        driver.set_backlog(backlog);
        driver.set_booster(booster);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                driver,
                services: Vec::new(),
                waiters: 0,
                device_stats: DeviceStats::default(),
                link_state: LinkState::Up,
                failed: None,
            }),
            cond: Condvar::new(),
            waker,
            stop: AtomicBool::new(false),
            clock,
            device_name,
        });
        let s2 = shared.clone();
        let handle = std::thread::Builder::new()
            .name("usnet-poll".into())
            .spawn(move || poll_loop(s2, rt))
            .map_err(RuntimeError::Thread)?;
        Ok(NetStack {
            shared,
            thread: Arc::new(Mutex::new(Some(handle))),
        })
    }

    /// Runs `f` with the stack locked (for inspection or sans-IO calls).
    pub fn with<R>(&self, f: impl FnOnce(&mut Stack) -> R) -> R {
        let mut g = self.shared.lock();
        let r = f(g.stack());
        drop(g);
        self.shared.waker.wake();
        r
    }

    /// Adds a service that runs inside the poll loop.
    pub fn add_service(&self, svc: Box<dyn Service>) {
        self.shared.lock().services.push(svc);
        self.shared.waker.wake();
    }

    /// Stack time now (nanoseconds since the stack started).
    pub fn now(&self) -> Instant {
        self.shared.now()
    }

    pub fn device_name(&self) -> &str {
        &self.shared.device_name
    }

    pub fn device_stats(&self) -> DeviceStats {
        self.shared.lock().device_stats
    }

    pub fn link_state(&self) -> LinkState {
        self.shared.lock().link_state
    }

    /// Why the poll loop stopped, if it stopped on its own.
    pub fn failure(&self) -> Option<String> {
        self.shared.lock().failed.clone()
    }

    pub fn is_running(&self) -> bool {
        !self.shared.stop.load(Ordering::Acquire)
            && self
                .thread
                .lock()
                .map(|t| t.as_ref().is_some_and(|h| !h.is_finished()))
                .unwrap_or(false)
    }

    /// Blocks until the stack stops (device failure, link down or `shutdown`).
    pub fn join(&self) {
        let h = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Stops the poll thread and wakes every blocked socket.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.waker.wake();
        self.shared.cond.notify_all();
        self.join();
        self.shared.cond.notify_all();
    }

    /// Waits until any of `handles` is readable or `timeout` passes (an epoll-like
    /// readiness wait over many sockets). Returns the readable ones. A TCP listener
    /// is readable when a connection waits to be accepted; a TCP connection when data,
    /// EOF or an error is there.
    pub fn wait_readable(
        &self,
        handles: &[usnet_stack::SocketHandle],
        timeout: Option<Duration>,
    ) -> Vec<usnet_stack::SocketHandle> {
        self.wait_ready(handles, timeout, |r| r.readable)
    }

    /// Waits until any of `handles` is writable (for TCP: a quarter of the send
    /// buffer is free, or the connection failed) or `timeout` passes.
    pub fn wait_writable(
        &self,
        handles: &[usnet_stack::SocketHandle],
        timeout: Option<Duration>,
    ) -> Vec<usnet_stack::SocketHandle> {
        self.wait_ready(handles, timeout, |r| r.writable)
    }

    /// Waits until `pred` holds for the readiness of any of `handles`.
    pub fn wait_ready(
        &self,
        handles: &[usnet_stack::SocketHandle],
        timeout: Option<Duration>,
        pred: impl Fn(usnet_stack::Readiness) -> bool,
    ) -> Vec<usnet_stack::SocketHandle> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut g = self.shared.lock();
        loop {
            let ready: Vec<_> = handles
                .iter()
                .copied()
                .filter(|h| g.stack().readiness(*h).is_ok_and(&pred))
                .collect();
            if !ready.is_empty() || self.shared.stop.load(Ordering::Acquire) {
                return ready;
            }
            match sockets::wait(&self.shared, g, deadline) {
                Some(ng) => g = ng,
                None => return Vec::new(),
            }
        }
    }
}

/// The poll thread: turns the driver under the lock, then sleeps on what the device
/// says (without the lock) after a short spin.
fn poll_loop(shared: Arc<Shared>, rt: RuntimeConfig) {
    let mut ready = Vec::new();
    let mut spin = usnet_driver::SpinWindow::new(rt.spin);
    loop {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let mut g = shared.lock();
        let inner = &mut *g;
        let services = &mut inner.services;
        let turn = inner.driver.turn_with(|stack| {
            let mut did = false;
            for svc in services.iter_mut() {
                did |= svc.poll(stack as &mut dyn usnet_socket_api::SocketApi);
            }
            did
        });
        let t = match turn {
            Ok(t) => t,
            Err(e) => {
                inner.failed = Some(format!("device {}: {e}", inner.driver.device().name()));
                break;
            }
        };
        inner.device_stats = inner.driver.device_stats();
        inner.link_state = inner.driver.link_state();
        inner.driver.stack_mut().take_ready(&mut ready);
        let notify =
            inner.waiters > 0 && (!ready.is_empty() || t.sent > 0 || t.link_changed || t.worked);
        ready.clear();
        if t.busy() {
            spin.worked();
        }
        if t.tx_backlog > 0 {
            // The device pushed back: retry soon without sleeping long.
            drop(g);
            if notify {
                shared.cond.notify_all();
            }
            std::thread::yield_now();
            continue;
        }
        if spin.keep_polling() {
            drop(g);
            if notify {
                shared.cond.notify_all();
            }
            std::hint::spin_loop();
            continue;
        }
        let (plan, timeout) = inner.driver.prepare_wait(Duration::from_millis(100));
        drop(g);
        if notify {
            shared.cond.notify_all();
        }
        // The re-check after announcing on a futex bell takes the lock briefly.
        let ready_now = || shared.lock().driver.device_mut().rx_ready();
        if let Err(e) = usnet_link::sleep_on(plan, &[], ready_now, timeout) {
            shared.lock().failed = Some(format!("device {}: wait failed: {e}", shared.device_name));
            break;
        }
    }
    // Buffers a device wrapper still holds (delayed frames) go back before the
    // device is dropped, so the pool's accounting stays exact. No consumer stays
    // boosted once the loop has stopped.
    {
        let mut g = shared.lock();
        g.driver.release_device_buffers();
        g.driver.restore_boosts();
    }
    shared.stop.store(true, Ordering::Release);
    shared.cond.notify_all();
}
