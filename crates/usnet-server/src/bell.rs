//! The server's own doorbell: what clients (and the server's other threads) ring when
//! the loop may sleep. Its kind follows the device's, so one wait covers both: an
//! eventfd next to a TAP or AF_PACKET socket (ppoll), a futex bell next to a shm link
//! or the emulated NIC (futex_waitv). Clients get it at attach: the eventfd itself, or
//! the server page that holds the futex bell.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use usnet_link::{Doorbell, WaitKind};
use usnet_session::ServerPage;
use usnet_session_abi::{BELL_EVENTFD, BELL_FUTEX};
use usnet_shm::{EventFd, FutexBell};

#[derive(Clone)]
pub struct ServerBell {
    page: ServerPage,
    futex: FutexBell,
    eventfd: Option<Arc<EventFd>>,
}

impl ServerBell {
    pub fn new(kind: WaitKind) -> std::io::Result<ServerBell> {
        let (k, eventfd) = match kind {
            WaitKind::Fd => (BELL_EVENTFD, Some(Arc::new(EventFd::new()?))),
            WaitKind::Bell => (BELL_FUTEX, None),
        };
        let page = ServerPage::create(k)?;
        let futex = page.bell();
        Ok(ServerBell {
            page,
            futex,
            eventfd,
        })
    }

    pub fn page(&self) -> &ServerPage {
        &self.page
    }

    pub fn eventfd(&self) -> Option<BorrowedFd<'_>> {
        self.eventfd.as_ref().map(|e| e.as_fd())
    }

    /// Wakes the loop (from another thread of the server process).
    pub fn ring(&self) {
        match &self.eventfd {
            Some(e) => e.ring(),
            None => self.futex.ring(),
        }
    }

    pub fn seq(&self) -> u32 {
        self.futex.seq()
    }

    /// The bell as one of the loop's doorbells.
    pub fn doorbell(&self, seen: u32) -> Doorbell<'_> {
        match &self.eventfd {
            Some(e) => Doorbell::Fd(e.as_fd()),
            None => Doorbell::Bell(&self.futex, seen),
        }
    }

    /// After a wake-up: an eventfd is drained (it stays readable otherwise).
    pub fn drain(&self) {
        if let Some(e) = &self.eventfd {
            e.drain();
        }
    }
}
