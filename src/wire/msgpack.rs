//! A zero-copy msgpack reader over a byte slice, just wide enough for the event payloads.
//!
//! Why hand-rolled rather than `rmpv::Value`: a vLLM batch is mostly integer arrays, and building a
//! value tree first (one heap node per token id) costs several times the decode itself. The reader
//! borrows strings and bins from the payload and never allocates.
//!
//! Every typed read either consumes exactly one value or, on a type mismatch, leaves the cursor where
//! it was ([`Fail::Type`]); [`Fail::Malformed`] means the bytes are not msgpack at all (truncation, the
//! reserved `0xc1` marker) and the whole payload is unusable. Lengths declared by the payload are
//! never trusted for allocation (see [`Reader::capacity_for`]).

/// Why a read failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fail {
    /// Not msgpack from this offset on: the payload is unusable.
    Malformed { offset: usize },
    /// A well-formed value of another type; the cursor did not move.
    Type { got: &'static str },
}

pub(crate) type Read<T> = Result<T, Fail>;

/// The msgpack family of the value at the cursor, for messages and dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    Bin,
    Array,
    Map,
    Ext,
}

impl Kind {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Kind::Nil => "nil",
            Kind::Bool => "bool",
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Str => "str",
            Kind::Bin => "bin",
            Kind::Array => "array",
            Kind::Map => "map",
            Kind::Ext => "ext",
        }
    }

    fn of(marker: u8) -> Option<Kind> {
        Some(match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => Kind::Int,
            0x80..=0x8f | 0xde | 0xdf => Kind::Map,
            0x90..=0x9f | 0xdc | 0xdd => Kind::Array,
            0xa0..=0xbf | 0xd9..=0xdb => Kind::Str,
            0xc0 => Kind::Nil,
            0xc2 | 0xc3 => Kind::Bool,
            0xc4..=0xc6 => Kind::Bin,
            0xc7..=0xc9 | 0xd4..=0xd8 => Kind::Ext,
            0xca | 0xcb => Kind::Float,
            0xc1 => return None,
        })
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Rewind to a position this reader returned earlier (to skip a value it failed to read).
    pub(crate) fn rewind(&mut self, pos: usize) {
        self.pos = pos;
    }

    /// The bytes between two positions this reader returned (`from <= to`).
    pub(crate) fn bytes_between(&self, from: usize, to: usize) -> &'a [u8] {
        self.buf.get(from..to).unwrap_or_default()
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// A safe `Vec` capacity for `declared` elements: every element takes at least one byte, so
    /// a length larger than the bytes left is a lie and must not drive an allocation.
    pub(crate) fn capacity_for(&self, declared: u32) -> usize {
        (declared as usize).min(self.remaining())
    }

    fn malformed(&self) -> Fail {
        Fail::Malformed { offset: self.pos }
    }

    #[inline]
    fn take(&mut self, n: usize) -> Read<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or(self.malformed())?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    #[inline]
    fn be<const N: usize>(&mut self) -> Read<[u8; N]> {
        let bytes = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn marker(&self) -> Read<u8> {
        self.buf.get(self.pos).copied().ok_or(self.malformed())
    }

    /// The kind of the next value, without consuming it.
    pub(crate) fn peek(&self) -> Read<Kind> {
        Kind::of(self.marker()?).ok_or(self.malformed())
    }

    fn mismatch<T>(&self) -> Read<T> {
        Err(Fail::Type {
            got: self.peek()?.name(),
        })
    }

    /// Consume a nil if one is next; `Ok(false)` (cursor unmoved) otherwise.
    pub(crate) fn nil(&mut self) -> Read<bool> {
        if self.marker()? == 0xc0 {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// A boolean.
    pub(crate) fn bool(&mut self) -> Read<bool> {
        match self.marker()? {
            m @ (0xc2 | 0xc3) => {
                self.pos += 1;
                Ok(m == 0xc3)
            }
            _ => self.mismatch(),
        }
    }

    /// Any msgpack integer, signed or unsigned, widened so no value is lost.
    #[inline]
    pub(crate) fn int(&mut self) -> Read<i128> {
        let m = self.marker()?;
        let start = self.pos;
        self.pos += 1;
        let v = match m {
            0x00..=0x7f => i128::from(m),
            0xe0..=0xff => i128::from(m as i8),
            0xcc => i128::from(self.be::<1>()?[0]),
            0xcd => i128::from(u16::from_be_bytes(self.be()?)),
            0xce => i128::from(u32::from_be_bytes(self.be()?)),
            0xcf => i128::from(u64::from_be_bytes(self.be()?)),
            0xd0 => i128::from(self.be::<1>()?[0] as i8),
            0xd1 => i128::from(i16::from_be_bytes(self.be()?)),
            0xd2 => i128::from(i32::from_be_bytes(self.be()?)),
            0xd3 => i128::from(i64::from_be_bytes(self.be()?)),
            _ => {
                self.pos = start;
                return self.mismatch();
            }
        };
        Ok(v)
    }

    /// A float (either width). Integers are a type mismatch here; callers that accept them read
    /// [`Reader::int`] on the `Int` kind.
    pub(crate) fn float(&mut self) -> Read<f64> {
        match self.marker()? {
            0xca => {
                self.pos += 1;
                Ok(f64::from(f32::from_be_bytes(self.be()?)))
            }
            0xcb => {
                self.pos += 1;
                Ok(f64::from_be_bytes(self.be()?))
            }
            _ => self.mismatch(),
        }
    }

    /// The raw bytes of a str (UTF-8 not yet checked).
    pub(crate) fn str_bytes(&mut self) -> Read<&'a [u8]> {
        let m = self.marker()?;
        let start = self.pos;
        self.pos += 1;
        let len = match m {
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => usize::from(self.be::<1>()?[0]),
            0xda => usize::from(u16::from_be_bytes(self.be()?)),
            0xdb => u32::from_be_bytes(self.be()?) as usize,
            _ => {
                self.pos = start;
                return self.mismatch();
            }
        };
        self.take(len)
    }

    /// A UTF-8 str. Invalid UTF-8 is reported as a type mismatch (`got: "non-utf8 str"`), with the
    /// cursor back on the value so the caller can skip it.
    pub(crate) fn str(&mut self) -> Read<&'a str> {
        let start = self.pos;
        let bytes = self.str_bytes()?;
        std::str::from_utf8(bytes).map_err(|_| {
            self.pos = start;
            Fail::Type {
                got: "non-utf8 str",
            }
        })
    }

    pub(crate) fn bin(&mut self) -> Read<&'a [u8]> {
        let m = self.marker()?;
        let len = match m {
            0xc4 => {
                self.pos += 1;
                usize::from(self.be::<1>()?[0])
            }
            0xc5 => {
                self.pos += 1;
                usize::from(u16::from_be_bytes(self.be()?))
            }
            0xc6 => {
                self.pos += 1;
                u32::from_be_bytes(self.be()?) as usize
            }
            _ => return self.mismatch(),
        };
        self.take(len)
    }

    pub(crate) fn array_len(&mut self) -> Read<u32> {
        let m = self.marker()?;
        match m {
            0x90..=0x9f => {
                self.pos += 1;
                Ok(u32::from(m & 0x0f))
            }
            0xdc => {
                self.pos += 1;
                Ok(u32::from(u16::from_be_bytes(self.be()?)))
            }
            0xdd => {
                self.pos += 1;
                Ok(u32::from_be_bytes(self.be()?))
            }
            _ => self.mismatch(),
        }
    }

    pub(crate) fn map_len(&mut self) -> Read<u32> {
        let m = self.marker()?;
        match m {
            0x80..=0x8f => {
                self.pos += 1;
                Ok(u32::from(m & 0x0f))
            }
            0xde => {
                self.pos += 1;
                Ok(u32::from(u16::from_be_bytes(self.be()?)))
            }
            0xdf => {
                self.pos += 1;
                Ok(u32::from_be_bytes(self.be()?))
            }
            _ => self.mismatch(),
        }
    }

    /// Skip one complete value of any type. Iterative (a count of values still owed), so hostile
    /// nesting cannot overflow the stack; every step consumes at least one byte, so it ends.
    pub(crate) fn skip(&mut self) -> Read<()> {
        let mut owed: u64 = 1;
        while owed > 0 {
            owed -= 1;
            let m = self.marker()?;
            self.pos += 1;
            let payload: usize = match m {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
                0x80..=0x8f => {
                    owed += 2 * u64::from(m & 0x0f);
                    0
                }
                0x90..=0x9f => {
                    owed += u64::from(m & 0x0f);
                    0
                }
                0xa0..=0xbf => usize::from(m & 0x1f),
                0xc1 => {
                    self.pos -= 1;
                    return Err(self.malformed());
                }
                0xcc | 0xd0 => 1,
                0xcd | 0xd1 => 2,
                0xce | 0xd2 | 0xca => 4,
                0xcf | 0xd3 | 0xcb => 8,
                0xc4 | 0xd9 => usize::from(self.be::<1>()?[0]),
                0xc5 | 0xda => usize::from(u16::from_be_bytes(self.be()?)),
                0xc6 | 0xdb => u32::from_be_bytes(self.be()?) as usize,
                0xc7 => usize::from(self.be::<1>()?[0]) + 1,
                0xc8 => usize::from(u16::from_be_bytes(self.be()?)) + 1,
                0xc9 => u32::from_be_bytes(self.be()?) as usize + 1,
                0xd4 => 2,
                0xd5 => 3,
                0xd6 => 5,
                0xd7 => 9,
                0xd8 => 17,
                0xdc => {
                    owed += u64::from(u16::from_be_bytes(self.be()?));
                    0
                }
                0xdd => {
                    owed += u64::from(u32::from_be_bytes(self.be()?));
                    0
                }
                0xde => {
                    owed += 2 * u64::from(u16::from_be_bytes(self.be()?));
                    0
                }
                0xdf => {
                    owed += 2 * u64::from(u32::from_be_bytes(self.be()?));
                    0
                }
            };
            self.take(payload)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_of_every_width_widen_exactly() {
        let cases: &[(&[u8], i128)] = &[
            (&[0x05], 5),
            (&[0xff], -1),
            (&[0xcc, 0xc8], 200),
            (&[0xcd, 0x01, 0x2c], 300),
            (&[0xce, 0x00, 0x01, 0x11, 0x70], 70000),
            (
                &[0xcf, 0xf1, 0xe2, 0xd3, 0xc4, 0xb5, 0xa6, 0x97, 0x88],
                0xF1E2_D3C4_B5A6_9788,
            ),
            (&[0xd0, 0x80], -128),
            (&[0xd1, 0xff, 0x00], -256),
            (&[0xd2, 0x80, 0, 0, 0], i128::from(i32::MIN)),
            (&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], i128::from(i64::MIN)),
        ];
        for (bytes, want) in cases {
            let mut r = Reader::new(bytes);
            assert_eq!(r.int(), Ok(*want), "{bytes:02x?}");
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn a_type_mismatch_leaves_the_cursor() {
        let mut r = Reader::new(&[0xa1, b'x']);
        assert_eq!(r.int(), Err(Fail::Type { got: "str" }));
        assert_eq!(r.pos(), 0);
        assert_eq!(r.str(), Ok("x"));
    }

    #[test]
    fn truncation_and_reserved_marker_are_malformed() {
        assert!(matches!(
            Reader::new(&[0xcf, 1, 2]).int(),
            Err(Fail::Malformed { .. })
        ));
        assert!(matches!(
            Reader::new(&[0xc1]).skip(),
            Err(Fail::Malformed { offset: 0 })
        ));
        assert!(matches!(
            Reader::new(&[0x92, 0x01]).skip(),
            Err(Fail::Malformed { .. })
        ));
        assert!(matches!(
            Reader::new(&[0xdb, 0xff, 0xff, 0xff, 0xff]).skip(),
            Err(Fail::Malformed { .. })
        ));
    }

    #[test]
    fn skip_crosses_nested_containers_and_ext() {
        // {"a": [1, [nil, true]], "b": fixext1} then a trailing 7
        let bytes = [
            0x82, 0xa1, b'a', 0x92, 0x01, 0x92, 0xc0, 0xc3, 0xa1, b'b', 0xd4, 0x01, 0x02, 0x07,
        ];
        let mut r = Reader::new(&bytes);
        r.skip().unwrap();
        assert_eq!(r.int(), Ok(7));
    }

    #[test]
    fn declared_lengths_do_not_drive_allocation() {
        let mut r = Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01]);
        let n = r.array_len().unwrap();
        assert_eq!(n, u32::MAX);
        assert_eq!(r.capacity_for(n), 1);
    }
}
