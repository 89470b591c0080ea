//! Zero-copy slots between the stack's vocabulary (`usnet_stack::zerocopy`) and the
//! port area's layout (`usnet_session_abi::zc`). Here, on the server, because the server is
//! the one that owns both: the sans-IO stack knows nothing of the ABI.

use usnet_session_abi::zc as abi;
use usnet_stack::zerocopy::Slot;
use usnet_stack::SocketHandle;

// Flags pass through unchanged: both vocabularies name `usnet_socket_api::zc_flags`.

/// A slot the client wrote, for the stack's port.
pub(crate) fn from_abi(s: abi::Slot) -> Slot {
    Slot::new(
        SocketHandle::from_raw(s.socket),
        s.buf,
        s.off,
        s.len,
        s.flags,
    )
}

/// A slot of the stack's port, for the client's area.
pub(crate) fn to_abi(s: &Slot) -> abi::Slot {
    abi::Slot {
        buf: s.buf,
        off: s.off,
        len: s.len,
        flags: s.flags,
        socket: s.socket,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip() {
        let a = abi::Slot {
            buf: 7,
            off: 64,
            len: 1400,
            flags: abi::SLOT_MORE | abi::SLOT_SHUT_WR,
            socket: 0x1_0000_0003,
        };
        assert_eq!(to_abi(&from_abi(a)), a);
        assert_eq!(to_abi(&Slot::default()).buf, abi::NO_BUF);
    }
}
