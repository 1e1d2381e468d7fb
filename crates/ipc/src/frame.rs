//! Frames: a 4-byte little-endian length, then a `postcard` message. A frame larger than
//! [`MAX_FRAME`] is refused before anything is allocated for it.

use serde::{Serialize, de::DeserializeOwned};
use std::io::{self, Read, Write};
use thiserror::Error;

/// The largest frame either side accepts (a full queue list of a busy daemon fits easily).
pub const MAX_FRAME: usize = 1 << 20;

#[derive(Debug, Error)]
pub enum FrameError {
    #[error("the peer closed the connection")]
    Closed,
    #[error("frame of {0} bytes is over the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("the frame's length says {expected} bytes but the connection ended after {got}")]
    Truncated { expected: usize, got: usize },
    #[error("malformed message")]
    Malformed(#[source] postcard::Error),
    #[error("message does not encode")]
    Encode(#[source] postcard::Error),
    #[error("socket I/O")]
    Io(#[from] io::Error),
}

/// Writes one message as a frame.
pub fn write<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    let body = postcard::to_stdvec(msg).map_err(FrameError::Encode)?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)?;
    Ok(())
}

/// Reads one frame's bytes (the length prefix checked against [`MAX_FRAME`]).
pub fn read_bytes(r: &mut impl Read) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        // A peer that closes with our answer unread resets the connection: between frames
        // that is a close like any other, not a bad frame.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
            ) =>
        {
            return Err(FrameError::Closed);
        }
        Err(e) => return Err(e.into()),
    }
    let expected = u32::from_le_bytes(len) as usize;
    if expected > MAX_FRAME {
        return Err(FrameError::TooLarge(expected));
    }
    let mut body = vec![0u8; expected];
    let mut got = 0;
    while got < expected {
        match r.read(&mut body[got..]) {
            Ok(0) => return Err(FrameError::Truncated { expected, got }),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(body)
}

/// Decodes a frame's bytes; trailing bytes make it malformed too.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) = postcard::take_from_bytes(body).map_err(FrameError::Malformed)?;
    if !rest.is_empty() {
        return Err(FrameError::Malformed(
            postcard::Error::DeserializeBadEncoding,
        ));
    }
    Ok(msg)
}

/// Reads and decodes one message.
pub fn read<T: DeserializeOwned>(r: &mut impl Read) -> Result<T, FrameError> {
    decode(&read_bytes(r)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::ClientMsg;
    use proptest::prelude::*;

    #[test]
    fn a_message_round_trips() {
        let m = ClientMsg::Unregister {
            queue: xpreempt_types::QueueId(3),
        };
        let mut buf = Vec::new();
        write(&mut buf, &m).unwrap();
        let back: ClientMsg = read(&mut buf.as_slice()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn oversized_and_truncated_frames_are_refused() {
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert!(matches!(
            read_bytes(&mut huge.as_slice()),
            Err(FrameError::TooLarge(_))
        ));
        let mut short = 10u32.to_le_bytes().to_vec();
        short.extend_from_slice(&[1, 2, 3]);
        assert!(matches!(
            read_bytes(&mut short.as_slice()),
            Err(FrameError::Truncated {
                expected: 10,
                got: 3
            })
        ));
        assert!(matches!(
            read_bytes(&mut [].as_slice()),
            Err(FrameError::Closed)
        ));
    }

    proptest! {
        /// Any bytes decode to a message or an error, never a panic.
        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<ClientMsg>(&bytes);
            let _ = read::<ClientMsg>(&mut bytes.as_slice());
        }
    }
}
