//! Every acceptance of simulated evidence logs a warning. Alone in its binary so that the
//! thread-local subscriber sees exactly this test's events.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mbx_attest::sim::{measure, signer_id};
use mbx_attest::{
    report_data, verify, Attester, HexBytes, Policy, SimulatedAttester, SimulatedPlatform,
};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata};

/// Counts WARN events.
struct WarnCounter(Arc<AtomicUsize>);

impl tracing::Subscriber for WarnCounter {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == Level::WARN {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn each_acceptance_of_simulated_evidence_warns() {
    let platform = Arc::new(SimulatedPlatform::generate().unwrap());
    let m = measure("prog", b"cfg");
    let attester = SimulatedAttester::new(platform.clone(), m, signer_id("s"));
    let policy = Policy {
        allow_simulated: true,
        measurements: vec![HexBytes::from(m)],
        sim_platform_keys: vec![HexBytes::from(platform.public_key())],
        ..Policy::default()
    };
    let rd = report_data(b"spki", &[9; 32]);
    let ev = attester.evidence(&rd).unwrap();

    let warnings = Arc::new(AtomicUsize::new(0));
    tracing::subscriber::with_default(WarnCounter(warnings.clone()), || {
        verify(&ev, &rd, &policy, 0).unwrap();
        assert_eq!(warnings.load(Ordering::SeqCst), 1);
        verify(&ev, &rd, &policy, 0).unwrap();
        assert_eq!(warnings.load(Ordering::SeqCst), 2);
        // A refusal is an error, not an acceptance warning.
        assert!(verify(&ev, &report_data(b"spki", &[8; 32]), &policy, 0).is_err());
        assert_eq!(warnings.load(Ordering::SeqCst), 2);
    });
}
