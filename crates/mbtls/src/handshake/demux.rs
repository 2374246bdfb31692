//! Splitting a primary connection's byte stream into primary records and subchannel records.

use mbx_wire::record::{encode_record, MAX_PLAINTEXT_LEN};
use mbx_wire::{ContentType, Record, RecordReader, WireError};

use crate::wire::{deframer_config, Encapsulated, CT_ENCAPSULATED};

/// One unit of the stream.
#[derive(Debug)]
pub enum Piece {
    /// A record of the primary session (or of the data phase).
    Primary(Record),
    /// An encapsulated record, decoded, with its raw outer record.
    Sub { raw: Record, enc: Encapsulated },
}

/// Deframes a stream that may carry encapsulated records. Errors are sticky.
#[derive(Debug)]
pub struct Demux {
    reader: RecordReader,
}

impl Default for Demux {
    fn default() -> Self {
        Self::new()
    }
}

impl Demux {
    pub fn new() -> Self {
        Demux {
            reader: RecordReader::new(deframer_config()),
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.reader.push(bytes);
    }

    /// Bytes pushed but not yet returned as pieces.
    pub fn buffered(&self) -> usize {
        self.reader.buffered()
    }

    /// Gives the buffer's memory back when nothing is buffered.
    pub fn release_if_empty(&mut self) {
        self.reader.release_if_empty();
    }

    /// The next whole piece, `Ok(None)` when more bytes are needed.
    pub fn next_piece(&mut self) -> Result<Option<Piece>, WireError> {
        let Some(rec) = self.reader.next_record()? else {
            return Ok(None);
        };
        if rec.content_type() == CT_ENCAPSULATED {
            let enc = Encapsulated::from_record(&rec)?;
            Ok(Some(Piece::Sub { raw: rec, enc }))
        } else {
            Ok(Some(Piece::Primary(rec)))
        }
    }
}

/// A handshake message (e.g. an optimistic ClientHello) as plaintext handshake records, the
/// form a TLS engine is fed.
pub fn hello_records(message: &[u8]) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    for chunk in message.chunks(MAX_PLAINTEXT_LEN) {
        encode_record(
            ContentType::HANDSHAKE,
            mbx_wire::version::TLS1_0,
            chunk,
            &mut out,
        )?;
    }
    Ok(out)
}
