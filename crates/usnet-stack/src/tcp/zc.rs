//! The pool side of zero-copy connections: where a received payload lies (its
//! [`Origin`]), copying a payload that does not lie in one buffer into buffers of its
//! own, and applying the engine's buffer-reference changes ([`BufOp`]) to the pool.

use usnet_pool::{PacketPool, PktBuf};
use usnet_tcp::{BufOp, Connection, Origin};

/// Where `part` (a slice of `buf`'s data) lies, counted from the buffer's start.
pub(crate) fn origin_in(pool: &PacketPool, buf: &PktBuf, part: &[u8]) -> Origin {
    let data = pool.data(buf);
    let at = part.as_ptr() as usize - data.as_ptr() as usize;
    debug_assert!(at + part.len() <= data.len(), "part lies in the buffer");
    Origin {
        buf: buf.index(),
        off: (pool.headroom_of(buf) + at) as u32,
    }
}

/// Copies `payload` into fresh pool buffers (a frame that arrived as a chain and was
/// linearised), so a zero-copy connection can hold it: `staged` gets the buffers
/// (the caller frees them after the input), `origins` where each part lies. Stops
/// early when the pool is empty; the connection then takes only what was staged.
pub(crate) fn stage(
    pool: &mut PacketPool,
    payload: &[u8],
    staged: &mut Vec<PktBuf>,
    origins: &mut Vec<Origin>,
) {
    for part in payload.chunks(pool.buf_size()) {
        let Some(b) = pool.alloc_continuation() else {
            return;
        };
        pool.space_mut(&b)[..part.len()].copy_from_slice(part);
        let _ = pool.set_len(&b, part.len());
        origins.push(Origin {
            buf: b.index(),
            off: pool.headroom_of(&b) as u32,
        });
        staged.push(b);
    }
}

/// Applies a zero-copy connection's reference changes to the pool (a no-op for a
/// copying connection). Call it right after every call into the connection, before
/// the frame that was input is freed.
pub(crate) fn settle_bufs(pool: &mut PacketPool, conn: &mut Connection) {
    if !conn.is_zero_copy() {
        return;
    }
    conn.take_buf_ops(|op| match op {
        BufOp::Retain(b) => match pool.checked(b) {
            Some(id) => pool.retain_index(id),
            None => debug_assert!(false, "engine retained free buffer {b}"),
        },
        BufOp::Release(b) => match pool.checked(b) {
            Some(id) => pool.release(id),
            None => debug_assert!(false, "engine released free buffer {b}"),
        },
    });
}
