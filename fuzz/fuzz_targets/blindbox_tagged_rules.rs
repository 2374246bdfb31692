//! Arbitrary bytes as a tagged-rules file and as a k_RG key file. Parsing must never panic; an
//! accepted tagged-rules file is canonical (writing it back gives the same bytes) and its rules
//! compile to a plan whose chunks are either signed or reported as unsigned.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_blindbox::rules::BufferPolicy;
use mbx_blindbox::tokenize::Tokenization;
use mbx_blindbox_setup::{RgKey, TaggedRules};

fuzz_target!(|data: &[u8]| {
    if let Ok(k) = RgKey::parse(data) {
        assert_eq!(
            RgKey::parse(k.to_file_string().as_bytes())
                .map(|k| k.key_id())
                .ok(),
            Some(k.key_id())
        );
    }
    let Ok(t) = TaggedRules::parse(data) else {
        return;
    };
    assert_eq!(t.to_bytes(), data, "accepted files are canonical");
    if t.rules_text().len() < 4096 {
        let plan = t.plan(Tokenization::Delimiter, BufferPolicy::Strict);
        let _ = t.signed_chunks(&plan);
    }
});
