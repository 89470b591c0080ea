//! Bounds-checked big-endian readers and writers. Each returns `Truncated`
//! instead of panicking, so parsers stay panic-free by construction.

use crate::WireError;

#[inline]
pub(crate) fn get<const N: usize>(d: &[u8], at: usize) -> Result<[u8; N], WireError> {
    let end = at.checked_add(N).ok_or(WireError::Truncated)?;
    d.get(at..end)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(WireError::Truncated)
}

#[inline]
pub(crate) fn u8_at(d: &[u8], at: usize) -> Result<u8, WireError> {
    d.get(at).copied().ok_or(WireError::Truncated)
}

#[inline]
pub(crate) fn u16_at(d: &[u8], at: usize) -> Result<u16, WireError> {
    get::<2>(d, at).map(u16::from_be_bytes)
}

#[inline]
pub(crate) fn u32_at(d: &[u8], at: usize) -> Result<u32, WireError> {
    get::<4>(d, at).map(u32::from_be_bytes)
}

#[inline]
pub(crate) fn put(d: &mut [u8], at: usize, v: &[u8]) -> Result<(), WireError> {
    let end = at.checked_add(v.len()).ok_or(WireError::Truncated)?;
    d.get_mut(at..end)
        .ok_or(WireError::Truncated)?
        .copy_from_slice(v);
    Ok(())
}

#[inline]
pub(crate) fn put16(d: &mut [u8], at: usize, v: u16) -> Result<(), WireError> {
    put(d, at, &v.to_be_bytes())
}

#[inline]
pub(crate) fn put32(d: &mut [u8], at: usize, v: u32) -> Result<(), WireError> {
    put(d, at, &v.to_be_bytes())
}

/// `d[from..to]` or `Truncated`.
#[inline]
pub(crate) fn slice(d: &[u8], from: usize, to: usize) -> Result<&[u8], WireError> {
    d.get(from..to).ok_or(WireError::Truncated)
}
