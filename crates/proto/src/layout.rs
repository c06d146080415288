//! How a message's fields lie on the wire, written once per message: a
//! table ([`layouts!`](crate::layouts)) names each variant's type code and
//! its fields with their [`Layout`], and the table gives both the encoder
//! and the decoder. The client frames (`frame.rs`) and the servers'
//! replication messages (the server's `wire.rs`) are such tables.
//!
//! Every read is bounds-checked by [`Reader`], so malformed input becomes
//! an error, never a panic.

use bytes::Bytes;

pub use crate::reader::Reader;
use crate::record::EventId;

/// Body length (u32) + frame type (u8).
pub const FRAME_HEADER_LEN: usize = 5;

/// Why bytes are not a frame (or a message inside one).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {length} bytes exceeds the limit of {limit} bytes")]
    TooLarge { length: usize, limit: usize },
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error("bad handshake magic")]
    BadMagic,
}

/// One field's wire form for values of `T`: how it is written and read
/// back. Implemented by marker types named in [`layouts!`](crate::layouts)
/// tables.
pub trait Layout<T> {
    fn put(value: &T, out: &mut Vec<u8>);
    /// `None`: the bytes do not hold a well-formed value.
    fn get(reader: &mut Reader<'_>) -> Option<T>;
}

/// A little-endian integer of the named width.
pub struct U8;
pub struct U16;
pub struct U32;
pub struct U64;
pub struct U128;

macro_rules! integer_layout {
    ($($marker:ident $ty:ident),*) => {$(
        impl Layout<$ty> for $marker {
            fn put(value: &$ty, out: &mut Vec<u8>) {
                out.extend_from_slice(&value.to_le_bytes());
            }
            fn get(reader: &mut Reader<'_>) -> Option<$ty> {
                reader.$ty()
            }
        }
    )*};
}

integer_layout!(U8 u8, U16 u16, U32 u32, U64 u64, U128 u128);

/// A u32 added after a layout's end: written only when not 0, read as 0
/// when the body ends before it.
pub struct Optional32;

impl Layout<u32> for Optional32 {
    fn put(value: &u32, out: &mut Vec<u8>) {
        if *value != 0 {
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
    fn get(reader: &mut Reader<'_>) -> Option<u32> {
        if reader.remaining() == 0 {
            Some(0)
        } else {
            reader.u32()
        }
    }
}

/// A UTF-8 string after its u16 length; an over-long string is cut on a
/// character boundary, so what is sent is still valid UTF-8.
pub struct Str16;

impl Layout<String> for Str16 {
    fn put(text: &String, out: &mut Vec<u8>) {
        let bytes = text.as_bytes();
        let mut length = bytes.len().min(u16::MAX as usize);
        while !text.is_char_boundary(length) {
            length -= 1;
        }
        out.extend_from_slice(&(length as u16).to_le_bytes());
        out.extend_from_slice(&bytes[..length]);
    }
    fn get(reader: &mut Reader<'_>) -> Option<String> {
        let length = usize::from(reader.u16()?);
        String::from_utf8(reader.take(length)?.to_vec()).ok()
    }
}

/// A UTF-8 string after its u32 length.
pub struct Str32;

impl Layout<String> for Str32 {
    fn put(text: &String, out: &mut Vec<u8>) {
        put_bytes32(out, text.as_bytes());
    }
    fn get(reader: &mut Reader<'_>) -> Option<String> {
        let length = reader.u32()? as usize;
        String::from_utf8(reader.take(length)?.to_vec()).ok()
    }
}

/// Bytes after their u32 length.
pub struct Bytes32;

/// Writes `bytes` after their u32 length (the [`Bytes32`] layout).
pub fn put_bytes32(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

impl Layout<Vec<u8>> for Bytes32 {
    fn put(value: &Vec<u8>, out: &mut Vec<u8>) {
        put_bytes32(out, value);
    }
    fn get(reader: &mut Reader<'_>) -> Option<Vec<u8>> {
        let length = reader.u32()? as usize;
        Some(reader.take(length)?.to_vec())
    }
}

impl Layout<Bytes> for Bytes32 {
    fn put(value: &Bytes, out: &mut Vec<u8>) {
        put_bytes32(out, value);
    }
    fn get(reader: &mut Reader<'_>) -> Option<Bytes> {
        let length = reader.u32()? as usize;
        reader.take_bytes(length)
    }
}

/// Every byte to the body's end (the last field of a layout).
pub struct Rest;

impl Layout<Vec<u8>> for Rest {
    fn put(value: &Vec<u8>, out: &mut Vec<u8>) {
        out.extend_from_slice(value);
    }
    fn get(reader: &mut Reader<'_>) -> Option<Vec<u8>> {
        Some(reader.rest().to_vec())
    }
}

impl Layout<Bytes> for Rest {
    fn put(value: &Bytes, out: &mut Vec<u8>) {
        out.extend_from_slice(value);
    }
    fn get(reader: &mut Reader<'_>) -> Option<Bytes> {
        Some(reader.rest_bytes())
    }
}

/// An event id: client u128, session u64, sequence u64.
pub struct Event;

impl Layout<EventId> for Event {
    fn put(event: &EventId, out: &mut Vec<u8>) {
        out.extend_from_slice(&event.client.to_le_bytes());
        out.extend_from_slice(&event.session.to_le_bytes());
        out.extend_from_slice(&event.sequence.to_le_bytes());
    }
    fn get(reader: &mut Reader<'_>) -> Option<EventId> {
        Some(EventId {
            client: reader.u128()?,
            session: reader.u64()?,
            sequence: reader.u64()?,
        })
    }
}

/// Writes a frame: the 5-byte header (body length, `kind`) and the body
/// `body` appends to `out`.
pub fn put_frame(out: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Vec<u8>)) {
    put_frame_head(out, kind, 0, body);
}

/// Writes the start of a frame whose body ends with `tail` more bytes that
/// the caller sends after it as they are (a payload, records), not copied
/// into `out`: the header counts them.
pub fn put_frame_head(out: &mut Vec<u8>, kind: u8, tail: usize, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
    body(out);
    let body_length = (out.len() - start - FRAME_HEADER_LEN + tail) as u32;
    out[start..start + 4].copy_from_slice(&body_length.to_le_bytes());
    out[start + 4] = kind;
}

/// A table of message layouts: for the enum `$ty`, each variant's type
/// code, its name in errors, an optional magic prefix, and its fields in
/// wire order, each with the [`Layout`] that writes and reads it. A field
/// may be a group `(a, b)` read by one layout of the pair and written by
/// its `put_parts((&a, &b), out)`. Generates
/// `$put(&$ty, &mut Vec<u8>) -> Option<u8>` (the type code; `None` for a
/// variant the table does not hold) and `$get(code, &mut Reader) ->
/// Option<Result<$ty, FrameError>>` (`None` for a code it does not hold;
/// a body with bytes left over is malformed), and `$kinds`, every code
/// with its name.
#[macro_export]
macro_rules! layouts {
    (
        $ty:ident: $put:ident, $get:ident, $kinds:ident;
        $( $variant:ident = $code:literal, $name:literal $(, magic $magic:path)?
            { $( $field:tt : $layout:ty ),* $(,)? } )*
    ) => {
        /// Every type code of the table, with its name.
        #[allow(dead_code)]
        const $kinds: &[(u8, &str)] = &[$(($code, $name)),*];

        #[allow(unreachable_patterns, unused_variables)]
        fn $put(value: &$ty, out: &mut Vec<u8>) -> Option<u8> {
            match value {
                $( $crate::__layout_fields!(@variant $ty $variant [] $($field)*) => {
                    $( out.extend_from_slice(&$magic); )?
                    $( $crate::__layout_fields!(@put $layout, $field, out); )*
                    Some($code)
                } )*
                _ => None,
            }
        }

        #[allow(unused_variables, clippy::redundant_closure_call)]
        fn $get(
            code: u8,
            reader: &mut $crate::layout::Reader<'_>,
        ) -> Option<Result<$ty, $crate::layout::FrameError>> {
            Some(match code {
                $( $code => {
                    $( if reader.take($magic.len()) != Some(&$magic[..]) {
                        return Some(Err($crate::layout::FrameError::BadMagic));
                    } )?
                    let value = (|| {
                        $( let $field = <$layout as $crate::layout::Layout<_>>::get(reader)?; )*
                        Some($crate::__layout_fields!(@variant $ty $variant [] $($field)*))
                    })();
                    match value {
                        Some(value) if reader.remaining() == 0 => Ok(value),
                        _ => Err($crate::layout::FrameError::Malformed($name)),
                    }
                } )*
                _ => return None,
            })
        }
    };
}

/// The pieces of [`layouts!`](crate::layouts): a variant's pattern and
/// expression with grouped fields laid flat, and a field's write.
#[doc(hidden)]
#[macro_export]
macro_rules! __layout_fields {
    (@variant $ty:ident $variant:ident [$($done:ident)*]) => {
        $ty::$variant { $($done),* }
    };
    (@variant $ty:ident $variant:ident [$($done:ident)*] ($($group:ident),+) $($rest:tt)*) => {
        $crate::__layout_fields!(@variant $ty $variant [$($done)* $($group)+] $($rest)*)
    };
    (@variant $ty:ident $variant:ident [$($done:ident)*] $field:ident $($rest:tt)*) => {
        $crate::__layout_fields!(@variant $ty $variant [$($done)* $field] $($rest)*)
    };
    (@put $layout:ty, ($($group:ident),+), $out:ident) => {
        <$layout>::put_parts(($($group),+), $out)
    };
    (@put $layout:ty, $field:ident, $out:ident) => {
        <$layout as $crate::layout::Layout<_>>::put($field, $out)
    };
}
