//! Every OT message parser on arbitrary bytes: must return errors, never panic.
#![no_main]

use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use mbx_ot::{peek_extend, OtReceiver, OtSender};
use rand::rngs::StdRng;
use rand::SeedableRng;

const SID: &[u8] = b"fuzz";

/// A sender and a receiver with the base OT done (building one costs 128 base OTs, so it is kept
/// across inputs and rebuilt only when a consistency-check failure aborted the sender).
struct Session {
    sender: OtSender,
    receiver: OtReceiver,
    rng: StdRng,
}

fn session() -> Session {
    let mut rng = StdRng::seed_from_u64(7);
    let (mut receiver, setup) = OtReceiver::new(SID, &mut rng);
    let (sender, reply) = OtSender::new(SID, &setup, &mut rng).expect("valid setup");
    receiver.handle_base_reply(&reply).expect("valid reply");
    Session {
        sender,
        receiver,
        rng,
    }
}

fn shared() -> &'static Mutex<Session> {
    static S: OnceLock<Mutex<Session>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(session()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, msg)) = data.split_first() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(1);
    match which % 4 {
        0 => {
            let _ = OtSender::new(SID, msg, &mut rng);
        }
        1 => {
            let (mut receiver, _) = OtReceiver::new(SID, &mut rng);
            let _ = receiver.handle_base_reply(msg);
        }
        2 => {
            let _ = peek_extend(msg);
            let mut s = shared().lock().unwrap_or_else(|e| e.into_inner());
            let n = peek_extend(msg).map(|(_, n)| n.min(1 << 16)).unwrap_or(1);
            let pairs = vec![([1u8; 16], [2u8; 16]); n];
            if s.sender.handle_extend(msg, &pairs).is_err() {
                // An aborted sender refuses everything: start over to keep exercising the parser.
                if s.sender.handle_extend(&[], &[]) == Err(mbx_ot::OtError::Aborted) {
                    *s = session();
                }
            }
        }
        _ => {
            let mut s = shared().lock().unwrap_or_else(|e| e.into_inner());
            let s = &mut *s;
            if s.receiver.pending_batches() == 0 {
                let _ = s.receiver.extend(&[true, false, true], &mut s.rng);
            }
            let _ = s.receiver.handle_transfer(msg);
        }
    }
});
