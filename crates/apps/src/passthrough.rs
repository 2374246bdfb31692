//! The identity function: what a plain relay does.

use crate::app::{Direction, MiddleboxApp, Verdict};

/// Forwards every byte unchanged, in both directions.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassThrough;

impl MiddleboxApp for PassThrough {
    fn on_data(&mut self, _dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        out.extend_from_slice(data);
        Verdict::Continue
    }

    fn pass_unchanged(&mut self, _dir: Direction, _data: &[u8]) -> Option<Verdict> {
        Some(Verdict::Continue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pass_through_is_identity(
            data in proptest::collection::vec(any::<u8>(), 0..4096),
            cuts in proptest::collection::vec(any::<usize>(), 0..16),
            dir in prop_oneof![Just(Direction::ClientToServer), Just(Direction::ServerToClient)],
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (data.len() + 1)).collect();
            cuts.sort_unstable();
            let mut app = PassThrough;
            let mut out = Vec::new();
            let mut prev = 0;
            for c in cuts.into_iter().chain([data.len()]) {
                prop_assert_eq!(app.on_data(dir, &data[prev..c], &mut out), Verdict::Continue);
                prev = c;
            }
            prop_assert_eq!(app.on_end(dir, &mut out), Verdict::Continue);
            prop_assert_eq!(out, data);
        }
    }
}
