//! The sender's pipeline: tokenizer and DPIEnc over one direction of a flow.
//!
//! The receiver's validation (paper §3.4) runs the same pipeline over what it decrypted and compares
//! the token messages with those the middlebox forwarded, so both sides must build it identically.

use crate::dpienc::{TokenEncryptor, TokenMsg};
use crate::tokenize::{FlowEvent, FlowTokenizer};

/// Tokenize-then-encrypt for one direction of a flow.
#[derive(Debug)]
pub struct Sender {
    tokenizer: FlowTokenizer,
    encryptor: TokenEncryptor,
    scratch: Vec<FlowEvent>,
}

impl Sender {
    pub fn new(tokenizer: FlowTokenizer, encryptor: TokenEncryptor) -> Self {
        Self {
            tokenizer,
            encryptor,
            scratch: Vec::new(),
        }
    }

    /// The next plaintext bytes of the flow; appends the token messages to `out`.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<TokenMsg>) {
        self.tokenizer.push(data, &mut self.scratch);
        self.flush(out);
    }

    /// The flow ended.
    pub fn finish(&mut self, out: &mut Vec<TokenMsg>) {
        self.tokenizer.finish(&mut self.scratch);
        self.flush(out);
    }

    fn flush(&mut self, out: &mut Vec<TokenMsg>) {
        self.encryptor.process_all(&self.scratch, out);
        self.scratch.clear();
    }
}
