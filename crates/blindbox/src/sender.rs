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
        // Window tokens of the exact lane go from the bytes to the encryptor directly.
        let encryptor = &mut self.encryptor;
        if !self
            .tokenizer
            .push_windows(data, |run| encryptor.process_window_run(run, out))
        {
            self.tokenizer.push(data, &mut self.scratch);
            self.flush(out);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aesni;
    use crate::dpienc::{FlowKey, TokenKey};
    use crate::tokenize::{CaseMode, Tokenization};
    use proptest::prelude::*;

    const K: [u8; 16] = [0x42; 16];

    /// One flow's token messages through [`Sender`] (`fast`: window runs for the exact lane) or
    /// through the event path (tokenizer events first, then the encryptor).
    fn encrypt(
        flow: (&[u8], bool),
        cuts: &[usize],
        key: TokenKey,
        period: u64,
        fast: bool,
    ) -> Vec<TokenMsg> {
        let (data, http) = flow;
        let mut tokenizer = FlowTokenizer::new(Tokenization::Window, CaseMode::Exact, http);
        let mut enc = encryptor(key, period);
        let mut out = Vec::new();
        if fast {
            let mut s = Sender::new(tokenizer, enc);
            for part in split(data, cuts) {
                s.push(part, &mut out);
            }
            s.finish(&mut out);
            return out;
        }
        let mut evs = Vec::new();
        for part in split(data, cuts) {
            tokenizer.push(part, &mut evs);
            enc.process_all(&evs, &mut out);
            evs.clear();
        }
        tokenizer.finish(&mut evs);
        enc.process_all(&evs, &mut out);
        out
    }

    /// Protocol III (every token with `c2`) for odd periods, Protocols I/II otherwise.
    fn encryptor(key: TokenKey, period: u64) -> TokenEncryptor {
        if period % 2 == 1 {
            TokenEncryptor::with_flow_key(key, 1 << 20, period, FlowKey::from_bytes([9; 16]))
        } else {
            TokenEncryptor::new(key, 1 << 20, period)
        }
    }

    fn split<'a>(data: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
        let mut parts = Vec::new();
        let mut rest = data;
        for &c in cuts {
            let (a, b) = rest.split_at(c.min(rest.len()));
            parts.push(a);
            rest = b;
        }
        parts.push(rest);
        parts
    }

    /// HTTP responses with text bodies (tokenized) and image bodies (skipped), and text around.
    fn flow() -> impl Strategy<Value = Vec<u8>> {
        let body = proptest::collection::vec(
            prop_oneof![Just(b'a'), Just(b'b'), Just(b' '), any::<u8>()],
            0..200,
        );
        proptest::collection::vec((any::<bool>(), body), 0..6).prop_map(|msgs| {
            let mut out = Vec::new();
            for (image, body) in msgs {
                let ty = if image { "image/png" } else { "text/html" };
                out.extend_from_slice(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {ty}\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    )
                    .as_bytes(),
                );
                out.extend_from_slice(&body);
            }
            out
        })
    }

    proptest! {
        /// The window fast path (bytes straight to the encryptor) emits exactly what the event
        /// path does, on every AES kernel and the portable code, however the flow is cut, for
        /// Protocols I/II and III.
        #[test]
        fn window_fast_path_equals_event_path(
            data in flow(),
            raw in proptest::collection::vec(any::<u8>(), 0..300),
            cuts in proptest::collection::vec(0usize..120, 0..12),
            period in prop_oneof![1u64..40, 40u64..5000],
        ) {
            let kernels = aesni::available_kernels();
            let keys = std::iter::once(None).chain(kernels.into_iter().map(Some));
            for kernel in keys {
                let key = || match kernel {
                    None => Some(TokenKey::portable(&K)),
                    Some(k) => TokenKey::with_kernel(&K, k),
                };
                let (Some(a), Some(b), Some(c), Some(d)) = (key(), key(), key(), key()) else {
                    return Err(TestCaseError::fail("an available kernel refused the key"));
                };
                for (flow, fast, slow) in [((&data[..], true), a, b), ((&raw[..], false), c, d)] {
                    prop_assert_eq!(
                        encrypt(flow, &cuts, fast, period, true),
                        encrypt(flow, &cuts, slow, period, false)
                    );
                }
            }
        }
    }
}
