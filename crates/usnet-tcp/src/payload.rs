//! A received segment's payload: one slice, or the payloads of several wire segments
//! that receive coalescing (GRO) joined without copying them. Each part may name the
//! pool buffer it lies in ([`Origin`]), so a zero-copy connection can keep the buffer
//! instead of copying the bytes.

use std::fmt;

/// Where a payload part lies in the stack's packet pool: buffer `buf`, from byte
/// `off` of that buffer's memory (not of its data window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Origin {
    /// Pool buffer index.
    pub buf: u32,
    /// Byte offset of the part's first byte inside the buffer.
    pub off: u32,
}

impl Origin {
    fn advance(self, n: usize) -> Origin {
        Origin {
            buf: self.buf,
            off: self.off + n as u32,
        }
    }
}

/// The payload of a [`Segment`](crate::Segment): the bytes of `first` followed by those
/// of `rest`, cut to `len`. Built with [`Payload::new`] (one slice) or
/// [`Payload::chain`] (several, in sequence order); the engine copies the bytes once,
/// into its receive ring, or (zero-copy connections) keeps the buffers the parts'
/// origins name.
#[derive(Clone, Copy, Default)]
pub struct Payload<'a> {
    /// Never longer than `len`.
    first: &'a [u8],
    /// Later parts; the last ones may reach past `len` (clipped when read).
    rest: &'a [&'a [u8]],
    len: usize,
    /// Where `first` lies in the pool, if known.
    first_origin: Option<Origin>,
    /// Where each of `rest` lies: empty (unknown) or one per part.
    rest_origins: &'a [Origin],
}

impl<'a> Payload<'a> {
    /// One contiguous payload.
    pub fn new(data: &'a [u8]) -> Self {
        Payload {
            first: data,
            rest: &[],
            len: data.len(),
            first_origin: None,
            rest_origins: &[],
        }
    }

    /// One contiguous payload lying at `origin` in the pool.
    pub fn with_origin(data: &'a [u8], origin: Origin) -> Self {
        Payload {
            first_origin: Some(origin),
            ..Payload::new(data)
        }
    }

    /// The concatenation of `parts`, in order.
    pub fn chain(parts: &'a [&'a [u8]]) -> Self {
        Payload::chain_with_origins(parts, &[])
    }

    /// [`Payload::chain`] whose parts lie at `origins` in the pool (one per part, or
    /// none at all).
    pub fn chain_with_origins(parts: &'a [&'a [u8]], origins: &'a [Origin]) -> Self {
        let origins = if origins.len() == parts.len() {
            origins
        } else {
            &[]
        };
        match parts.split_first() {
            None => Payload::default(),
            Some((first, rest)) => Payload {
                first,
                rest,
                len: first.len() + rest.iter().map(|p| p.len()).sum::<usize>(),
                first_origin: origins.first().copied(),
                rest_origins: origins.get(1..).unwrap_or(&[]),
            },
        }
    }

    /// The parts with their origins, in order (non-empty parts only, clipped to
    /// `len`).
    pub fn spans(&self) -> impl Iterator<Item = (&'a [u8], Option<Origin>)> + 'a {
        let mut left = self.len;
        let first = std::iter::once((self.first, self.first_origin));
        let origins = self.rest_origins;
        let rest = self
            .rest
            .iter()
            .enumerate()
            .map(move |(k, p)| (*p, origins.get(k).copied()));
        first.chain(rest).filter_map(move |(p, o)| {
            let p = &p[..p.len().min(left)];
            left -= p.len();
            (!p.is_empty()).then_some((p, o))
        })
    }

    /// Bytes in the payload.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes as consecutive non-empty slices.
    pub fn chunks(&self) -> Chunks<'a> {
        Chunks {
            first: self.first,
            rest: self.rest.iter(),
            left: self.len,
        }
    }

    /// The one slice holding all the bytes, if they are contiguous.
    pub fn as_slice(&self) -> Option<&'a [u8]> {
        (self.first.len() == self.len).then_some(self.first)
    }

    /// Without the first `n` bytes.
    pub fn skip(self, n: usize) -> Self {
        let n = n.min(self.len);
        let len = self.len - n;
        if n < self.first.len() || self.rest.is_empty() {
            let k = n.min(self.first.len());
            let first = &self.first[k..];
            let first_origin = self.first_origin.map(|o| o.advance(k));
            return Payload {
                first,
                len,
                first_origin,
                ..self
            };
        }
        let mut left = n - self.first.len();
        for (k, p) in self.rest.iter().enumerate() {
            if left < p.len() {
                let first = &p[left..];
                return Payload {
                    first: &first[..first.len().min(len)],
                    rest: &self.rest[k + 1..],
                    len,
                    first_origin: self.rest_origins.get(k).map(|o| o.advance(left)),
                    rest_origins: self.rest_origins.get(k + 1..).unwrap_or(&[]),
                };
            }
            left -= p.len();
        }
        Payload::default()
    }

    /// The first `n` bytes (all of them if there are fewer).
    pub fn take(self, n: usize) -> Self {
        if n >= self.len {
            return self;
        }
        if n <= self.first.len() {
            return Payload {
                first: &self.first[..n],
                rest: &[],
                len: n,
                first_origin: self.first_origin,
                rest_origins: &[],
            };
        }
        Payload { len: n, ..self }
    }

    /// A copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in self.chunks() {
            v.extend_from_slice(c);
        }
        v
    }
}

impl<'a> From<&'a [u8]> for Payload<'a> {
    fn from(data: &'a [u8]) -> Self {
        Payload::new(data)
    }
}

impl fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes", self.len)?;
        if !self.rest.is_empty() {
            write!(f, " in {} parts", self.chunks().count())?;
        }
        write!(f, ")")
    }
}

/// The slices of a [`Payload`], from [`Payload::chunks`].
#[derive(Debug, Clone)]
pub struct Chunks<'a> {
    first: &'a [u8],
    rest: std::slice::Iter<'a, &'a [u8]>,
    left: usize,
}

impl<'a> Iterator for Chunks<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        loop {
            if self.left == 0 {
                return None;
            }
            let p = if self.first.is_empty() {
                self.rest.next()?
            } else {
                std::mem::take(&mut self.first)
            };
            let p = &p[..p.len().min(self.left)];
            if !p.is_empty() {
                self.left -= p.len();
                return Some(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        let mut b = 0u8;
        for n in [5usize, 5, 0, 5, 3] {
            v.push(
                (0..n)
                    .map(|_| {
                        b += 1;
                        b
                    })
                    .collect(),
            );
        }
        v
    }

    #[test]
    fn chain_skip_take_match_a_flat_copy() {
        let owned = parts();
        let refs: Vec<&[u8]> = owned.iter().map(|p| &p[..]).collect();
        let flat: Vec<u8> = owned.concat();
        let p = Payload::chain(&refs);
        assert_eq!(p.len(), flat.len());
        assert_eq!(p.to_vec(), flat);
        assert!(p.as_slice().is_none());
        for skip in 0..=flat.len() + 1 {
            for take in 0..=flat.len() + 1 {
                let q = p.skip(skip).take(take);
                let want: Vec<u8> = flat.iter().skip(skip).take(take).copied().collect();
                assert_eq!(q.to_vec(), want, "skip {skip} take {take}");
                assert_eq!(q.len(), want.len());
                assert_eq!(q.is_empty(), want.is_empty());
                assert!(q.chunks().all(|c| !c.is_empty()));
                let r = p.take(take).skip(skip);
                let want: Vec<u8> = flat.iter().take(take).skip(skip).copied().collect();
                assert_eq!(r.to_vec(), want, "take {take} skip {skip}");
            }
        }
    }

    #[test]
    fn origins_follow_skip_and_take() {
        let owned = parts();
        let refs: Vec<&[u8]> = owned.iter().map(|p| &p[..]).collect();
        let origins: Vec<Origin> = (0..refs.len() as u32)
            .map(|k| Origin { buf: k, off: 100 })
            .collect();
        let p = Payload::chain_with_origins(&refs, &origins);
        let flat: Vec<u8> = owned.concat();
        // Where byte i of the flat payload lies: (part, offset in part).
        let mut at = Vec::new();
        for (k, part) in owned.iter().enumerate() {
            for i in 0..part.len() {
                at.push((k as u32, 100 + i as u32));
            }
        }
        for skip in 0..=flat.len() {
            for take in 0..=flat.len() {
                let q = p.skip(skip).take(take);
                let mut i = skip;
                for (bytes, o) in q.spans() {
                    let o = o.expect("every part has an origin");
                    assert_eq!((o.buf, o.off), at[i], "skip {skip} take {take}");
                    assert_eq!(bytes, &flat[i..i + bytes.len()]);
                    i += bytes.len();
                }
                assert_eq!(i, (skip + take).min(flat.len()).max(skip));
            }
        }
        assert!(Payload::chain(&refs).spans().all(|(_, o)| o.is_none()));
    }

    #[test]
    fn single_slice() {
        let d = [1u8, 2, 3, 4];
        let p = Payload::new(&d);
        assert_eq!(p.as_slice(), Some(&d[..]));
        assert_eq!(p.skip(1).take(2).as_slice(), Some(&d[1..3]));
        assert_eq!(p.chunks().count(), 1);
        assert!(Payload::chain(&[]).is_empty());
        assert_eq!(Payload::default().chunks().count(), 0);
    }
}
